"""A run's context: everything its data plane is authorised by, checked on construction."""

from __future__ import annotations

from typing import Any, Final, Literal
from urllib.parse import urlsplit

import attrs

from .. import _checks as checks
from .. import crypto
from ..errors import InvalidInputError
from ..names import normalize_play_name
from ..sessions import PreloadedSession

__all__ = ["STRATEGIES", "RuntimeContext", "Strategy"]

Strategy = Literal["direct", "gateway_only"]
STRATEGIES: Final = ("direct", "gateway_only")


def _base_url(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    text = checks.text(attribute.name, value)
    try:
        parts = urlsplit(text.strip())
        valid = parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
    except ValueError:  # a malformed bracketed host
        valid = False
    if not valid:
        raise InvalidInputError(f"base_url must be an http(s) URL with a host, got {value!r}")


def _url_tuple(value: object) -> tuple[str, ...]:
    return tuple(str(url) for url in checks.sequence("base_urls", value, "URL"))


def _more_urls(instance: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    for url in value:
        _base_url(instance, attribute, url)


def _nonempty(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    checks.text(attribute.name, value)


def _token(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError("token must be a non-empty string")


def _strategy(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if value not in STRATEGIES:
        raise InvalidInputError(f"strategy must be one of {STRATEGIES}, got {value!r}")


def _preloaded(value: object) -> tuple[PreloadedSession, ...]:
    checked = []
    for index, item in enumerate(checks.sequence("preloaded_sessions", value, "PreloadedSession")):
        if not isinstance(item, PreloadedSession):
            raise InvalidInputError(
                f"preloaded_sessions[{index}] must be a PreloadedSession, got {item!r}"
            )
        checked.append(item)
    return tuple(checked)


def _optional_email(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    checks.optional_text(attribute.name, value)


@attrs.frozen
class RuntimeContext:
    """Everything a run's data plane is authorised by. The token is never in its repr."""

    base_url: str = attrs.field(validator=_base_url)
    """The runtime gateway's base URL (the first, when several were given)."""
    token: str = attrs.field(repr=False, validator=_token)
    """The executor token (a secret)."""
    org_id: str = attrs.field(validator=_nonempty)
    """The organisation the run belongs to."""
    play_name: str = attrs.field(converter=normalize_play_name)
    """The play being run (normalised: ``sheetplane.names``)."""
    run_id: str = attrs.field(validator=_nonempty)
    """The run: stamped on admitted rows, and carried by terminal writes and receipts."""
    strategy: Strategy = attrs.field(default="direct", validator=_strategy)
    """``direct`` (reads and terminal writes on scoped sessions) or ``gateway_only``."""
    preloaded_sessions: tuple[PreloadedSession, ...] = attrs.field(
        default=(), converter=_preloaded, repr=False
    )
    """Sessions a harness minted ahead of the run (used before minting new ones)."""
    unwrap_key: bytes | None = attrs.field(
        default=None, repr=False, validator=crypto.optional_unwrap_key
    )
    """The harness key that opens preloaded sessions' URLs (a secret)."""
    user_email: str | None = attrs.field(default=None, validator=_optional_email)
    """The user on whose behalf the run acts, if any."""
    base_urls: tuple[str, ...] = attrs.field(default=(), converter=_url_tuple, validator=_more_urls)
    """Further URLs of the same gateway deployment: a call that cannot reach one
    (or meets one draining) tries the next."""
