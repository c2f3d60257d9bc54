"""Executor tokens: ``authorization: Bearer <token>`` names the caller's org.

Tokens are configured as ``TOKEN=ORG`` pairs. Only their SHA-256 digests are
kept, and a presented token is compared with every configured digest in
constant time, so neither the comparison's timing nor a memory dump tells
which token was close. No message or log line ever contains a token.

The org is part of a sheet's identity (``SheetRef.org_id``): a request acts on
its token's org. A request may name an org explicitly with ``orgId`` (at the
top level, or inside ``input`` or ``target``); naming any org other than the
token's is answered 403, never silently rewritten.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ...errors import InvalidInputError
from ...protocol import Code, token_digest
from ._http import ActionError

__all__ = ["TokenTable", "check_org", "parse_token_pairs"]

_TOKEN_ID_CHARS = 32


@attrs.frozen(repr=False)
class TokenTable:
    """Token digests and the org each one names."""

    _entries: tuple[tuple[str, str], ...]

    @classmethod
    def from_mapping(cls, tokens: Mapping[str, str]) -> TokenTable:
        """Build from ``{token: org}``; empty tokens or orgs raise ``InvalidInputError``."""
        entries = []
        for token, org in tokens.items():
            if not isinstance(token, str) or not token.strip():
                raise InvalidInputError("an executor token must be a non-empty string")
            if not isinstance(org, str) or not org.strip():
                raise InvalidInputError("an executor token's org must be a non-empty string")
            entries.append((token_digest(token), org.strip()))
        return cls(tuple(entries))

    def __repr__(self) -> str:
        return f"<TokenTable {len(self._entries)} token(s)>"

    def __len__(self) -> int:
        return len(self._entries)

    def org_for(self, authorization: str | None) -> str:
        """The org of a ``Bearer`` authorization header; 401 if missing or unknown."""
        return self.identify(authorization)[0]

    def identify(self, authorization: str | None) -> tuple[str, str]:
        """``(org, token id)`` of a ``Bearer`` authorization header; 401 if missing or unknown.

        Every configured digest is compared (no early exit). The token id names
        the token in the gateway's session ledger (its live-session cap) without
        holding it: a SHA-256 of its digest under a purpose prefix.
        """
        if authorization is None:
            raise ActionError(401, Code.UNAUTHORIZED, "missing executor token")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise ActionError(401, Code.UNAUTHORIZED, "missing executor token")
        presented = token_digest(token)
        found: str | None = None
        for digest, org in self._entries:
            if hmac.compare_digest(presented, digest) and found is None:
                found = org
        if found is None:
            raise ActionError(401, Code.UNAUTHORIZED, "invalid executor token")
        token_id = hashlib.sha256(f"sheetplane-session-cap:{presented}".encode()).hexdigest()
        return found, token_id[:_TOKEN_ID_CHARS]


def parse_token_pairs(pairs: Iterable[str], *, source: str = "--token") -> dict[str, str]:
    """``["TOKEN=ORG", ...]`` (``--token`` values, or the pairs of another ``source``)
    as ``{token: org}``.

    A malformed pair raises ``InvalidInputError`` naming its source and position,
    never its text.
    """
    tokens: dict[str, str] = {}
    for index, pair in enumerate(pairs, start=1):
        token, sep, org = pair.partition("=")
        if not sep or not token.strip() or not org.strip():
            raise InvalidInputError(f"{source} #{index} must have the form TOKEN=ORG")
        tokens[token.strip()] = org.strip()
    return tokens


def check_org(body: Mapping[str, Any], org_id: str) -> None:
    """403 when the request names an org other than its token's."""
    candidates = [body.get("orgId")]
    for member in ("input", "target"):
        nested = body.get(member)
        if isinstance(nested, Mapping):
            candidates.append(nested.get("orgId"))
    for named in candidates:
        if named is None:
            continue
        if not isinstance(named, str):
            raise ActionError(400, Code.INVALID_REQUEST, "orgId must be a string")
        if named != org_id:
            raise ActionError(403, Code.FORBIDDEN, "the executor token does not grant that org")
