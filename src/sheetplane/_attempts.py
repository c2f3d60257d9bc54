"""An attempt as a value other processes can take up, and the shares its workers claim.

::

    attempt = admission.attempt                  # Attempt: play_name, table_namespace,
    text = attempt.to_json()                     #   run_id, write_version (no secret)
    attempt = Attempt.from_json(text)            # in any process
    report = await rt.map_attempt(attempt, contract, fn)
    status = await rt.attempt_status(attempt)    # AttemptStatus

An attempt's pending rows are mapped in *shares*: a share is a block of up to
``rows`` pending rows in input order (a range of ``_input_index``), claimed by
one worker under a lease (``ShareClaim``) that the worker renews while it maps
them. The rules are the store's (``store/_shares.py``); the values here are
what both roads hand back. No I/O.
"""

from __future__ import annotations

import json
from typing import Any, Final, Literal

import attrs

from ._ints import check_int
from ._types import BIGINT_MAX
from .budgets import (
    SHARE_LEASE_GUARD_MS,
    SHARE_LEASE_MIN_TTL_MS,
    SHARE_LEASE_RENEWAL_MS,
    SHARE_LEASE_TTL_MS,
    SHARE_POLL_MS,
)
from .errors import InvalidInputError
from .names import normalize_play_name, normalize_table_namespace

__all__ = [
    "Attempt",
    "AttemptStatus",
    "ClaimOutcome",
    "ShareClaim",
    "ShareLease",
    "ShareRenewal",
]

#: The JSON form's members, in order; ``from_json`` takes exactly these.
_MEMBERS: Final = ("playName", "tableNamespace", "runId", "writeVersion")


def _text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _play(value: object) -> str:
    return normalize_play_name(_text("play_name", value))


def _namespace(value: object) -> str:
    return normalize_table_namespace(_text("table_namespace", value))


def _run(value: object) -> str:
    return _text("run_id", value)


def _write_version(value: object) -> int:
    return check_int("write_version", value, 1, BIGINT_MAX)


@attrs.frozen
class Attempt:
    """One admission of a sheet, as any process may take it up: what ``map_attempt``
    maps and ``attempt_status`` reports on. It names the attempt; it grants nothing
    (a worker still needs its own token for the play's org)."""

    play_name: str = attrs.field(converter=_play)
    """The play whose sheet it is."""
    table_namespace: str = attrs.field(converter=_namespace)
    """The sheet's namespace."""
    run_id: str = attrs.field(converter=_run)
    """The run that admitted it (stamped on the rows its workers write)."""
    write_version: int = attrs.field(converter=_write_version)
    """The admission's write version: every worker's writes are fenced by it."""

    def to_json(self) -> str:
        """``{"playName", "tableNamespace", "runId", "writeVersion"}``: no secret."""
        values = (self.play_name, self.table_namespace, self.run_id, self.write_version)
        return json.dumps(dict(zip(_MEMBERS, values, strict=True)), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Attempt:
        """The attempt ``to_json`` wrote; ``InvalidInputError`` for anything else."""
        try:
            value: Any = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"not an attempt's JSON: {exc}") from None
        if not isinstance(value, dict) or sorted(value) != sorted(_MEMBERS):
            raise InvalidInputError(f"an attempt's JSON has exactly the members {list(_MEMBERS)}")
        return cls(*(value[name] for name in _MEMBERS))


@attrs.frozen
class AttemptStatus:
    """Where an attempt stands (``Runtime.attempt_status``)."""

    pending: int
    """Rows of the attempt not yet written terminal (claimed or not)."""
    claimed: int
    """Of those, rows in a share whose lease is live."""
    enriched: int
    """Rows the attempt's workers wrote enriched."""
    failed: int
    """Rows the attempt's workers wrote failed."""
    workers: int
    """Distinct workers holding a live lease on a share."""
    superseded: bool = False
    """A newer admission of the sheet took its rows over: no worker may write."""

    @property
    def done(self) -> bool:
        """No row of the attempt is left to map (or it was superseded)."""
        return self.superseded or self.pending == 0


ClaimOutcome = Literal["claimed", "none", "superseded"]


@attrs.frozen
class ShareClaim:
    """The answer to a claim: a share, none left to claim, or the attempt superseded."""

    outcome: ClaimOutcome
    """``claimed``: this worker holds ``share``; ``none``: no unclaimed share is left
    (``live`` others are held); ``superseded``: a newer admission owns the rows."""
    share: int | None = None
    """The share's number within the attempt (from 1), when claimed."""
    first_index: int | None = None
    """Its first ``_input_index``."""
    last_index: int | None = None
    """Its last ``_input_index``."""
    taken_over: bool = False
    """Whether the share was claimed before (by a worker whose lease ended, or who
    gave it back unfinished)."""
    live: int = 0
    """Shares of the attempt held under a live lease by other claims, when ``none``."""
    retry_after_ms: int | None = None
    """When ``none`` with live shares: how long until the first of them expires."""


@attrs.frozen
class ShareRenewal:
    """The answer to a renewal or release."""

    outcome: Literal["renewed", "released", "lost", "superseded"]
    """``lost``: the share is no longer this claim's (its lease ended and another
    worker took it, or it was released)."""


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    check_int(attribute.name, value, 1)


@attrs.frozen
class ShareLease:
    """How a worker keeps its shares' leases, in milliseconds (defaults: ``budgets``).

    The relations are checked here for any values, and at import for the
    defaults: a renewal sent ``renewal_ms`` after the last one landed may take
    ``call_ms`` and still land ``guard_ms`` before the expiry, when the worker
    stops its share's work if none did. Tests and benchmarks pass shorter ones
    to see a takeover in seconds (at least ``SHARE_LEASE_MIN_TTL_MS``).
    """

    ttl_ms: int = attrs.field(default=SHARE_LEASE_TTL_MS, validator=_positive)
    """The lease's length, asked of the store with every claim and renewal."""
    renewal_ms: int = attrs.field(default=SHARE_LEASE_RENEWAL_MS, validator=_positive)
    """How long after a landed claim or renewal the next renewal is sent."""
    guard_ms: int = attrs.field(default=SHARE_LEASE_GUARD_MS, validator=_positive)
    """How long before the expiry bound the worker stops a share it could not renew."""
    poll_ms: int = attrs.field(default=SHARE_POLL_MS, validator=_positive)
    """How often a worker with nothing to claim asks again while others hold shares."""

    def __attrs_post_init__(self) -> None:
        if not SHARE_LEASE_MIN_TTL_MS <= self.ttl_ms <= SHARE_LEASE_TTL_MS:
            raise InvalidInputError(
                f"ttl_ms must be from {SHARE_LEASE_MIN_TTL_MS} to {SHARE_LEASE_TTL_MS}, "
                f"got {self.ttl_ms}"
            )
        if self.renewal_ms + self.guard_ms >= self.ttl_ms:
            raise InvalidInputError(
                "renewal_ms + guard_ms must be under ttl_ms (a renewal needs time to land), "
                f"got {self.renewal_ms} + {self.guard_ms} >= {self.ttl_ms}"
            )

    @property
    def call_ms(self) -> int:
        """What one renewal may take and still land before the guard."""
        return self.ttl_ms - self.renewal_ms - self.guard_ms
