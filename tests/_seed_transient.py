"""The runtime's transient-message pattern as it is written there, and one text per alternative.

The pattern is copied from the runtime's ``isTransientRuntimeApiErrorMessage``
character for character; ``ALTERNATIVES`` splits it at its top-level ``|``
so a test can show that every alternative, and nothing else, is retried.
"""

from __future__ import annotations

from typing import Final

SEED_TRANSIENT_PATTERN: Final = (
    r"timeout exceeded when trying to connect|timed out|fetch failed|ECONNRESET|ECONNREFUSED"
    r"|UND_ERR_CONNECT_TIMEOUT|requested endpoint could not be found, or you don't have access"
    r"|Neon API request failed \((?:408|429|502|503|504)\)"
    r"|RUNTIME_SCHEDULER_(?:SATURATED|UNAVAILABLE|SCHEMA_NOT_READY)"
    r"|RUNTIME_RATE_STATE_UNAVAILABLE|Runtime scheduler DB pool is saturated"
    r"|Runtime scheduler DB circuit breaker is open|Runtime rate state .* is unavailable"
)


def top_level_alternatives(pattern: str) -> list[str]:
    """``pattern`` split at the ``|`` that are outside every group."""
    parts: list[str] = []
    depth = 0
    start = 0
    escaped = False
    for index, char in enumerate(pattern):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            parts.append(pattern[start:index])
            start = index + 1
    parts.append(pattern[start:])
    return parts


ALTERNATIVES: Final = top_level_alternatives(SEED_TRANSIENT_PATTERN)

#: An error text for each alternative (and each inner choice), in mixed case,
#: embedded in the kind of sentence a gateway or driver writes around it.
EXAMPLES: Final[dict[str, tuple[str, ...]]] = {
    "timeout exceeded when trying to connect": ("Error: timeout exceeded when trying to connect",),
    "timed out": ("query TIMED OUT after 30s",),
    "fetch failed": ("TypeError: fetch failed",),
    "ECONNRESET": ("read econnreset",),
    "ECONNREFUSED": ("connect ECONNREFUSED 10.0.0.1:5432",),
    "UND_ERR_CONNECT_TIMEOUT": ("ConnectTimeoutError (UND_ERR_CONNECT_TIMEOUT)",),
    "requested endpoint could not be found, or you don't have access": (
        "The requested endpoint could not be found, or you don't have access to it.",
        "REQUESTED ENDPOINT COULD NOT BE FOUND, OR YOU DON'T HAVE ACCESS",
    ),
    r"Neon API request failed \((?:408|429|502|503|504)\)": tuple(
        f"Neon API request failed ({code}): try later" for code in (408, 429, 502, 503, 504)
    ),
    "RUNTIME_SCHEDULER_(?:SATURATED|UNAVAILABLE|SCHEMA_NOT_READY)": tuple(
        f"RUNTIME_SCHEDULER_{suffix}: busy"
        for suffix in ("SATURATED", "UNAVAILABLE", "SCHEMA_NOT_READY")
    ),
    "RUNTIME_RATE_STATE_UNAVAILABLE": ("runtime_rate_state_unavailable",),
    "Runtime scheduler DB pool is saturated": ("Runtime scheduler DB pool is saturated (64/64)",),
    "Runtime scheduler DB circuit breaker is open": (
        "Runtime scheduler DB circuit breaker is open",
    ),
    "Runtime rate state .* is unavailable": ("Runtime rate state for org-1 is unavailable",),
}

#: Texts that are near an alternative and must not be retried.
NOT_TRANSIENT: Final = (
    "Neon API request failed (400)",
    "Neon API request failed (404)",
    "requested endpoint could not be found",
    "RUNTIME_SCHEDULER_READY",
    "invalid token",
    "sheet not found",
    "",
)
