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
from pathlib import Path

import attrs

from ... import protocol as m
from ..._types import ResolvedPlay
from ...errors import InvalidInputError

__all__ = ["PlayDefinition", "load_plays", "play_from_json", "play_of"]


@attrs.frozen
class PlayDefinition:
    """One org's play, as loaded or registered."""

    org_id: str
    """The org that owns the play."""
    name: str | None
    """A second reference to it, besides its id."""
    play: ResolvedPlay
    """What ``resolve_play`` answers."""


def play_from_json(value: object, *, where: str = "") -> PlayDefinition:
    """A definition from a file's JSON object (a ``PlayDefinitionWire`` naming its
    ``orgId``); ``InvalidInputError`` naming the bad field."""
    try:
        wire = m.structure(value, m.PlayDefinitionWire)
    except m.WireError as exc:
        raise InvalidInputError(f"{where}{exc}") from None
    if wire.org_id is None:
        raise InvalidInputError(f"{where}orgId must be a non-empty string")
    return play_of(wire, wire.org_id)


def play_of(wire: m.PlayDefinitionWire, org_id: str) -> PlayDefinition:
    """The definition ``wire`` holds, as ``org_id``'s play (``InvalidInputError`` when
    it names another org)."""
    if wire.org_id is not None and wire.org_id != org_id:
        raise InvalidInputError("play.orgId must be the token's org (or left out)")
    return PlayDefinition(org_id, wire.name, m.copy_fields(wire, ResolvedPlay))


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
