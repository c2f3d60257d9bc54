"""Play definitions the reference gateway serves through ``resolve_play``.

A definition is a JSON object::

    {"orgId": "acme", "playId": "play-1", "name": "enrich-leads",
     "sourceCode": "...", "artifact": {...}, "codeFormat": "function",
     "contractSnapshot": {...}}

``orgId`` says whose play it is (a ``register_play`` request takes the
token's org instead and refuses another); ``name`` is an optional second
reference besides the id. ``sheetplane serve --plays DIR`` loads every
``*.json`` file of ``DIR`` (an object or a list of them) when the gateway
starts; ``register_play`` registers one at run time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ..._types import CODE_FORMATS, ResolvedPlay
from ...errors import InvalidInputError

__all__ = ["PlayDefinition", "load_plays", "play_answer", "play_from_json"]

_FIELDS = frozenset(
    {"orgId", "playId", "name", "sourceCode", "artifact", "codeFormat", "contractSnapshot"}
)


@attrs.frozen
class PlayDefinition:
    """One org's play, as loaded or registered."""

    org_id: str
    """The org that owns the play."""
    name: str | None
    """A second reference to it, besides its id."""
    play: ResolvedPlay
    """What ``resolve_play`` answers."""


def _text(value: Mapping[str, Any], field: str, where: str, *, required: bool) -> str | None:
    item = value.get(field)
    if item is None and not required:
        return None
    if not isinstance(item, str) or not item.strip():
        raise InvalidInputError(f"{where}{field} must be a non-empty string")
    return item


def play_from_json(value: object, *, where: str = "", org_id: str | None = None) -> PlayDefinition:
    """A definition from its JSON object; ``org_id`` (the caller's) replaces ``orgId``.

    Raises ``InvalidInputError`` naming the bad field.
    """
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"{where or 'a play'} must be an object")
    unknown = sorted(set(value) - _FIELDS)
    if unknown:
        raise InvalidInputError(
            f"{where}play fields must be among {sorted(_FIELDS)}, got {unknown}"
        )
    if org_id is None:
        owner = _text(value, "orgId", where, required=True)
        assert owner is not None
    else:
        stated = value.get("orgId")
        if stated is not None and stated != org_id:
            raise InvalidInputError(f"{where}orgId must be the token's org (or left out)")
        owner = org_id
    play_id = _text(value, "playId", where, required=True)
    source = value.get("sourceCode")
    if source is not None and not isinstance(source, str):
        raise InvalidInputError(f"{where}sourceCode must be a string or null")
    code_format = value.get("codeFormat")
    if code_format is not None and code_format not in CODE_FORMATS:
        raise InvalidInputError(f"{where}codeFormat must be one of {list(CODE_FORMATS)} or null")
    snapshot = value.get("contractSnapshot")
    if snapshot is not None and not isinstance(snapshot, Mapping):
        raise InvalidInputError(f"{where}contractSnapshot must be an object or null")
    assert play_id is not None
    play = ResolvedPlay(play_id, source, value.get("artifact"), code_format, snapshot)
    return PlayDefinition(owner, _text(value, "name", where, required=False), play)


def play_answer(play: ResolvedPlay) -> dict[str, Any]:
    """The ``play`` member of a ``resolve_play`` answer."""
    snapshot = play.contract_snapshot
    return {
        "playId": play.play_id,
        "sourceCode": play.source_code,
        "artifact": play.artifact,
        "codeFormat": play.code_format,
        "contractSnapshot": None if snapshot is None else dict(snapshot),
    }


def load_plays(directory: Path) -> tuple[PlayDefinition, ...]:
    """Every definition in ``directory``'s ``*.json`` files, in file-name order.

    Raises ``InvalidInputError`` naming the file (and the item in a list).
    """
    if not directory.is_dir():
        raise InvalidInputError(f"--plays {directory}: not a directory")
    definitions: list[PlayDefinition] = []
    for path in sorted(directory.glob("*.json")):
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InvalidInputError(
                f"{path.name}: not a JSON file ({type(exc).__name__})"
            ) from None
        items = value if isinstance(value, list) else [value]
        for index, item in enumerate(items):
            where = f"{path.name}[{index}]: " if isinstance(value, list) else f"{path.name}: "
            definitions.append(play_from_json(item, where=where))
    return tuple(definitions)
