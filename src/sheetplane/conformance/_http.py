"""The kit's own HTTP: literal JSON over httpx, every exchange kept as evidence.

The kit judges a gateway by the documented wire, so it shares none of
sheetplane's wire classes or client: requests are plain dicts sent as JSON,
answers are whatever JSON came back. Every exchange is recorded so a failure
can show the request it made, the answer it got and what it expected.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import attrs
import httpx

__all__ = ["RUNTIME_PATH", "UNSUPPORTED_TEXT", "Exchange", "Wire", "clip"]

#: The runtime route under a gateway's base URL (the seed's and the docs' path).
RUNTIME_PATH: Final = "/api/v2/plays/internal/runtime"

#: What the error of a gateway that does not know an action says (lower case; the seed
#: matches it case-insensitively).
UNSUPPORTED_TEXT: Final = "unsupported runtime data-plane action"

#: How much of a request or an answer a line of evidence shows.
EVIDENCE_CHARS: Final = 400


def clip(value: Any, limit: int = EVIDENCE_CHARS) -> str:
    """``value`` as compact JSON (or text), cut to ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


@attrs.frozen
class Exchange:
    """One request and its answer."""

    method: str
    """``POST`` or ``GET``."""
    path: str
    """The path under the base URL."""
    request: Any
    """The JSON body sent (or a description of a raw one)."""
    status: int
    """The answer's HTTP status."""
    answer: Any
    """The answer's JSON body, or None when it was not JSON."""
    text: str = attrs.field(repr=False)
    """The answer's body as text (cut)."""
    headers: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    """The answer's headers."""

    @property
    def json_object(self) -> dict[str, Any]:
        """The answer when it is a JSON object, else an empty dict."""
        return self.answer if isinstance(self.answer, dict) else {}

    def error_text(self) -> str:
        """The answer's error message: ``error``, else ``details``, else ``debug_error``."""
        for member in ("error", "details", "debug_error"):
            if isinstance(self.json_object.get(member), str):
                return str(self.json_object[member])
        return ""

    @property
    def unsupported(self) -> bool:
        """A 400 saying the gateway does not know the action."""
        return self.status == 400 and UNSUPPORTED_TEXT in self.error_text().lower()

    def describe(self) -> str:
        """``request: POST /path {...}; answer: 200 {...}``."""
        shown = self.text if self.answer is None else self.answer
        return (
            f"request: {self.method} {self.path} {clip(self.request)}; "
            f"answer: {self.status} {clip(shown)}"
        )


@attrs.define(eq=False)
class Wire:
    """A gateway as the kit talks to it: one token, one play, a log of exchanges."""

    base_url: str
    token: str | None = attrs.field(repr=False)
    play_name: str
    client: httpx.Client = attrs.field(repr=False)
    exchanges: list[Exchange] = attrs.field(factory=list, repr=False)
    token_refused: bool = False
    """Whether the gateway answered 401 to a request that carried this wire's token."""

    def post(
        self,
        action: str,
        payload: Mapping[str, Any],
        *,
        token: str | object | None = ...,
        headers: Mapping[str, str] | None = None,
    ) -> Exchange:
        """POST ``{action, playName, **payload}`` to the runtime route."""
        body = {"action": action, "playName": self.play_name, **payload}
        return self.post_body(body, token=token, headers=headers)

    def post_body(
        self,
        body: Any,
        *,
        token: str | object | None = ...,
        headers: Mapping[str, str] | None = None,
    ) -> Exchange:
        """POST any JSON ``body`` (``token=None``: no authorization header)."""
        sent_headers = {"content-type": "application/json", **(headers or {})}
        bearer = self.token if token is ... else token
        if isinstance(bearer, str):
            sent_headers["authorization"] = f"Bearer {bearer}"
        content = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        response = self.client.post(RUNTIME_PATH, content=content, headers=sent_headers)
        if response.status_code == 401 and bearer is not None and bearer == self.token:
            self.token_refused = True
        return self._keep("POST", RUNTIME_PATH, body, response)

    def get(self, path: str) -> Exchange:
        """GET ``path`` under the base URL."""
        return self._keep("GET", path, None, self.client.get(path))

    def _keep(self, method: str, path: str, body: Any, response: httpx.Response) -> Exchange:
        text = response.text
        try:
            answer = json.loads(text) if text else None
        except ValueError:
            answer = None
        exchange = Exchange(
            method=method,
            path=path,
            request=_redacted(body),
            status=response.status_code,
            answer=answer,
            text=text[: 4 * EVIDENCE_CHARS],
            headers=dict(response.headers),
        )
        self.exchanges.append(exchange)
        return exchange


def _redacted(body: Any) -> Any:
    """The request as evidence shows it: a public key's modulus cut short."""
    if isinstance(body, dict) and isinstance(body.get("postgresUrlEncryption"), dict):
        return {**body, "postgresUrlEncryption": {"alg": body["postgresUrlEncryption"].get("alg")}}
    return body
