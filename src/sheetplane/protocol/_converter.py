"""The converter of the wire classes (``protocol/_messages.py``), and
the field rules those classes are declared with.

The converter checks what the wire promises, strictly: a string is a ``str``
(never a number turned into text), an integer is an ``int`` or an integral
finite number, an object is an object. A message that breaks a rule raises
:class:`WireError` whose message names the field as the wire spells it
(``input.pages[0].limit must be between 1 and 5000, got 0``). Members a class
does not name are ignored, as the seed's gateway ignores them, unless the class
is declared closed.

A field whose absence means something other than null (``input.after``: absent
reads by offset, null reads by keyset from the start) defaults to
:data:`ABSENT`, and is left out when written. A field's wire name is the
camelCase of its Python name, or its ``wire`` metadata.
"""

from __future__ import annotations

import enum
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn, override

from .._types import unchecked
from ..budgets import (
    MAX_ERROR_TEXT_BYTES,
    MAX_REQUEST_TEXT_BYTES,
    MAX_ROW_KEY_BYTES,
    MAX_RUN_ID_BYTES,
    MAX_USER_EMAIL_BYTES,
)

__all__ = [
    "ABSENT",
    "TEXT_CAPS",
    "Absent",
    "Checked",
    "Verbatim",
    "WireConverter",
    "WireError",
    "admission_id_field",
    "between",
    "build",
    "build_checked",
    "check_text_cap",
    "count_rule",
    "domain_text_field",
    "int_field",
    "lease_token_field",
    "non_empty",
    "optional_int_field",
    "optional_text_field",
    "rule",
    "text_field",
    "wire_name",
]

T = TypeVar("T")


class Absent(enum.Enum):
    """The type of :data:`ABSENT`."""

    ABSENT = "absent"


#: A member left out of the message (not the same as null).
ABSENT: Final = Absent.ABSENT


class WireError(ValueError):
    """A message that does not have its class's shape; the text names the field."""


class Verbatim(ValueError):
    """A rule whose message is the whole answer (a seed error text), not a field's."""


class Checked(list[T]):
    """A list member built from values a domain check already held to the member's
    rules (a client's pages, checked by ``check_page_batch``): its count rule is not
    run again, and its items are made with ``sheetplane._types.unchecked``."""


#: The longest text (UTF-8 bytes) a request member may carry, by wire name; every
#: other text member of a request stops at ``MAX_REQUEST_TEXT_BYTES``. What the
#: gateway stores is capped before it reaches the store, so no request grows a
#: table by more than its rows.
TEXT_CAPS: Final[Mapping[str, int]] = {
    "runId": MAX_RUN_ID_BYTES,
    "holder": MAX_RUN_ID_BYTES,
    "userEmail": MAX_USER_EMAIL_BYTES,
    "error": MAX_ERROR_TEXT_BYTES,
    "key": MAX_ROW_KEY_BYTES,
}


def check_text_cap(value: str, name: str) -> str | None:
    """Why ``value`` (the member ``name``) is too long, or None."""
    cap = TEXT_CAPS.get(name, MAX_REQUEST_TEXT_BYTES)
    # At most 4 bytes a character: only a string that could be past the cap is encoded.
    if len(value) * 4 > cap and len(value.encode("utf-8", "surrogatepass")) > cap:
        return f"is longer than {cap} bytes"
    return None


# --- field rules (attrs validators); each message starts after the field's name ----------


def rule(check: Callable[[Any], str | None]) -> Any:
    def validate(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is None or value is ABSENT:
            return
        problem = check(value)
        if problem is not None:
            raise ValueError(problem)

    return validate


def non_empty(value: object) -> str | None:
    """What is wrong with a required text member (``text_field``), or None."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    return None if value.strip() else "must be a non-empty string"


def between(minimum: int, maximum: int | None = None) -> Any:
    def check(value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, got {type(value).__name__}"
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
            return f"must be {bound}, got {value}"
        return None

    return rule(check)


def count_rule(minimum: int, maximum: int, verbatim: str | None = None) -> Any:
    def validate(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, Checked):
            return
        if not isinstance(value, list):
            raise ValueError(f"must be a list, got {type(value).__name__}")
        if not minimum <= len(value) <= maximum:
            if verbatim is not None:
                raise Verbatim(verbatim)
            raise ValueError(f"must hold {minimum} to {maximum} items, got {len(value)}")

    return validate


_TEXT = rule(non_empty)


def text_field() -> Any:
    """A required non-empty string."""
    return attrs.field(validator=_TEXT, metadata={"minLength": 1, "pattern": r"\S"})


def domain_text_field() -> Any:
    """A required string whose rule the domain value it is read into states (a contract
    column's ``id`` and ``sqlName``: ``ContractColumn``'s check): the schema says it
    is never blank, and the domain check refuses it, once, on both roads."""
    return attrs.field(metadata={"minLength": 1, "pattern": r"\S"})


def admission_id_field() -> Any:
    """A staged admission's id: 32 lowercase hex digits (``uuid.uuid4().hex``)."""
    return attrs.field(
        validator=rule(_hex_id), metadata={"pattern": "^[0-9a-f]{32}$", "minLength": 32}
    )


def _hex_id(value: object) -> str | None:
    if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{32}", value):
        return None
    return "must be 32 lowercase hex digits"


#: A lease token on the wire: 16 to 2,048 printable ASCII characters, no space.
_LEASE_TOKEN = re.compile(r"[\x21-\x7e]{16,2048}")


def _lease_token(value: object) -> str | None:
    if isinstance(value, str) and _LEASE_TOKEN.fullmatch(value):
        return None
    # Never echo it: a malformed token may still be someone's secret.
    return "must be 16 to 2048 printable ASCII characters (the claim's answer carries it)"


def lease_token_field(*, required: bool) -> Any:
    """A work receipt lease's secret token (never in a repr)."""
    metadata = {"pattern": "^[\\x21-\\x7e]{16,2048}$", "minLength": 16, "maxLength": 2048}
    if required:
        return attrs.field(validator=rule(_lease_token), repr=False, metadata=metadata)
    return attrs.field(default=None, validator=rule(_lease_token), repr=False, metadata=metadata)


def optional_text_field(*, non_empty: bool = False) -> Any:
    """A string or null (left out when null); with ``non_empty``, never blank."""
    if non_empty:
        return attrs.field(
            default=None, validator=_TEXT, metadata={"minLength": 1, "pattern": r"\S"}
        )
    return attrs.field(default=None)


def int_field(minimum: int, maximum: int | None = None) -> Any:
    return attrs.field(
        validator=between(minimum, maximum), metadata={"minimum": minimum, "maximum": maximum}
    )


def optional_int_field(minimum: int, maximum: int | None = None) -> Any:
    return attrs.field(
        default=None,
        validator=between(minimum, maximum),
        metadata={"minimum": minimum, "maximum": maximum},
    )


def wire_name(name: str | attrs.Attribute[Any]) -> str:
    """The wire name of a field: its ``wire`` metadata (a JWE member keeps its
    RFC 7516 name), else the camelCase of its Python name (``sql_name`` -> ``sqlName``)."""
    if not isinstance(name, str):
        return str(name.metadata.get("wire") or wire_name(name.name))
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


# --- the converter ------------------------------------------------------------------------------


def _strict_str(value: object, _: type) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    return value


def _strict_int(value: object, _: type) -> int:
    """An int, or an integral finite JSON number (``5.0``); never a bool or text."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be an integer")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ValueError("must be an integer")
        return int(value)
    return value


def _strict_float(value: object, _: type) -> float:
    """A finite JSON number. An integer stays exact (10**300 has no float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a number")
    return value


def _strict_bool(value: object, _: type) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be a boolean")
    return value


def _object(value: object, _: type) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("must be an object")
    return value


def _array(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError("must be an array")
    return value


def _is_dict(cls: Any) -> bool:
    origin: Any = typing.get_origin(cls)
    return origin is dict


def _is_json_value(cls: Any) -> bool:
    """A member that holds JSON as it is (``Any``, an object of JSON values)."""
    return cls is Any or _is_dict(cls)


def _is_list(cls: Any) -> bool:
    return typing.get_origin(cls) is list


def _is_literal(cls: Any) -> bool:
    origin: Any = typing.get_origin(cls)
    return origin is Literal


def _literal_hook(cls: Any) -> Callable[[Any, Any], Any]:
    allowed = typing.get_args(cls)

    def structure(value: Any, _: Any) -> Any:
        if isinstance(value, bool) != isinstance(allowed[0], bool) or value not in allowed:
            raise ValueError(f"must be one of {list(allowed)}, got {value!r}")
        return value

    return structure


def _is_optional(cls: Any) -> bool:
    args = typing.get_args(cls)
    return (
        typing.get_origin(cls) in (typing.Union, types.UnionType)
        and (type(None) in args or Absent in args)
        and len([m for m in args if m not in (type(None), Absent)]) == 1
    )


@attrs.define
class _Located(Exception):
    """A structuring error with where it happened, innermost last."""

    where: str
    error: BaseException


def _failing_field(cls: type[Any], kwargs: dict[str, Any]) -> str:
    for field in attrs.fields(cls):
        if field.validator is None or field.name not in kwargs:
            continue
        try:
            field.validator(None, field, kwargs[field.name])
        except ValueError:
            return wire_name(field)
    return cls.__name__


def _join(outer: str, inner: str) -> str:
    return f"{outer}{inner}" if inner.startswith("[") else f"{outer}.{inner}"


class WireConverter:
    """The converter of a set of wire classes, built once from its whole policy.

    ``closed`` classes refuse unknown members, ``uncapped`` classes' texts are
    not capped (``TEXT_CAPS``), and ``writes_nulls`` classes write the nulls
    they hold (the others leave a null field with a null default out). Every
    hook is registered here, on this converter's own ``cattrs.Converter``:
    nothing is changed after construction and nothing global is mutated.
    """

    def __init__(
        self,
        *,
        closed: frozenset[type[Any]],
        uncapped: frozenset[type[Any]],
        writes_nulls: frozenset[type[Any]],
    ) -> None:
        self._closed: Final = closed
        self._uncapped: Final = uncapped
        self._writes_nulls: Final = writes_nulls
        c = self._cattrs = cattrs.Converter()
        c.register_structure_hook(str, _strict_str)
        c.register_structure_hook(int, _strict_int)
        c.register_structure_hook(float, _strict_float)
        c.register_structure_hook(bool, _strict_bool)
        c.register_structure_hook_func(_is_dict, _object)
        c.register_structure_hook_func(lambda cls: cls is Any, lambda value, _: value)
        # A JSON value is written as it is held: rows and results are neither copied nor
        # walked (they were read as JSON, or are checked by the JSON measure before sending).
        c.register_unstructure_hook_func(_is_json_value, lambda value: value)
        c.register_structure_hook_factory(_is_list, self._list_hook)
        c.register_structure_hook_factory(_is_literal, _literal_hook)
        c.register_structure_hook_factory(_is_optional, self._union_hook)
        c.register_structure_hook_factory(attrs.has, self._class_hook)
        c.register_unstructure_hook_factory(attrs.has, self._unstructure_hook)

    def _list_hook(self, cls: Any) -> Callable[[Any, Any], list[Any]]:
        (item,) = typing.get_args(cls)
        inner = self._cattrs.get_structure_hook(item)

        def structure(value: Any, _: Any) -> list[Any]:
            out = []
            for index, element in enumerate(_array(value)):
                try:
                    out.append(inner(element, item))
                except _Located as exc:
                    raise _Located(_join(f"[{index}]", exc.where), exc.error) from None
                except (ValueError, TypeError) as exc:
                    raise _Located(f"[{index}]", exc) from None
            return out

        if inner is _strict_str:

            def strings(value: Any, _: Any) -> list[Any]:
                """A list of strings (a chunk's keys): one pass over the members' types,
                in C; the member by member walk names a bad one."""
                members = _array(value)
                if all(map(str.__instancecheck__, members)):
                    return list(members)
                return structure(value, _)

            return strings
        if inner is not _object:
            return structure

        def objects(value: Any, _: Any) -> list[Any]:
            """A list of JSON objects kept as they are (a page's rows): one pass over
            the members' types, in C; the member by member walk names a bad one."""
            members = _array(value)
            if not set(map(type, members)) - {dict}:
                return members
            return structure(value, _)

        return objects

    def _union_hook(self, cls: Any) -> Callable[[Any, Any], Any]:
        """``X | None``, ``X | Absent`` and ``X | None | Absent``: null is None; else X."""
        members = [m for m in typing.get_args(cls) if m not in (type(None), Absent)]
        nullable = type(None) in typing.get_args(cls)
        (inner_type,) = members
        inner = self._cattrs.get_structure_hook(inner_type)

        def structure(value: Any, _: Any) -> Any:
            if value is None:
                if nullable:
                    return None
                raise ValueError("must not be null")
            return inner(value, inner_type)

        return structure

    def _class_hook(self, cls: type[Any]) -> Callable[[Any, Any], Any]:
        fields = attrs.fields(attrs.resolve_types(cls))
        names = {f.name: wire_name(f) for f in fields}
        hooks = {f.name: self._cattrs.get_structure_hook(f.type) for f in fields}
        closed = cls in self._closed
        capped = {
            f.name for f in fields if cls not in self._uncapped and f.type in (str, str | None)
        }

        def structure(value: Any, _: Any) -> Any:
            data = _object(value, cls)
            if closed:
                unknown = set(data) - set(names.values())
                if unknown:
                    raise ValueError(
                        f"may carry only {sorted(names.values())}, got {sorted(unknown)}"
                    )
            kwargs: dict[str, Any] = {}
            for field in fields:
                key = names[field.name]
                if key not in data:
                    if field.default is attrs.NOTHING:
                        raise _Located(key, ValueError("is required"))
                    continue
                try:
                    kwargs[field.name] = item = hooks[field.name](data[key], field.type)
                    if field.name in capped and item is not None:
                        problem = check_text_cap(item, key)
                        if problem is not None:
                            raise ValueError(problem)
                except _Located as exc:
                    raise _Located(_join(key, exc.where), exc.error) from None
                except (ValueError, TypeError) as exc:
                    raise _Located(key, exc) from None
            try:
                return cls(**kwargs)
            except Verbatim as exc:
                raise _Located("", exc) from None
            except ValueError as exc:
                # A field rule: attrs runs validators in field order; find the field named.
                raise _Located(_failing_field(cls, kwargs), exc) from None

        return structure

    def _unstructure_hook(self, cls: type[Any]) -> Callable[[Any], dict[str, Any]]:
        """The class's writer, generated by cattrs: each member under its wire name, an
        ``ABSENT`` one left out, and a null one left out where its default is null unless
        the class writes the nulls it holds."""
        fields = attrs.fields(attrs.resolve_types(cls))
        writes_nulls = cls in self._writes_nulls
        overrides: dict[str, Any] = {
            field.name: override(
                rename=wire_name(field),
                omit_if_default=field.default is ABSENT
                or (field.default is None and not writes_nulls),
            )
            for field in fields
        }
        hook: Callable[[Any], dict[str, Any]] = make_dict_unstructure_fn(
            cls, self._cattrs, _cattrs_omit_if_default=False, **overrides
        )
        return hook

    def structure(self, value: object, cls: type[T]) -> T:
        """``value`` (decoded JSON) as ``cls``; :class:`WireError` naming the field if it is off."""
        try:
            return self._cattrs.structure(value, cls)
        except _Located as exc:
            if isinstance(exc.error, Verbatim):
                raise WireError(str(exc.error)) from None
            raise WireError(f"{exc.where} {exc.error}") from None
        except (ValueError, TypeError) as exc:
            raise WireError(f"the body {exc}") from None

    def unstructure(self, value: Any) -> dict[str, Any]:
        """The wire form of a message (camelCase, absent members left out)."""
        out: dict[str, Any] = self._cattrs.unstructure(value)
        return out


def build(cls: type[T], **fields: Any) -> T:
    """``cls(**fields)``, a message about to be written; :class:`WireError` naming the
    member whose rule a value breaks (``limit must be between 1 and 5000, got 0``)."""
    try:
        return cls(**fields)
    except Verbatim as exc:
        raise WireError(str(exc)) from None
    except ValueError as exc:
        raise WireError(f"{_failing_field(cls, fields)} {exc}") from None


#: The type of an attrs default made by a factory (its stubs type ``attrs.Factory`` as
#: a function).
_FACTORY: Final[type[Any]] = typing.cast(Any, attrs.Factory)


def build_checked(cls: type[T], checked: Mapping[str, Any], /, **fields: Any) -> T:
    """``build(cls, **fields, **checked)`` where a domain check already held the
    ``checked`` members to their fields' rules (a single read's ``limit`` and
    ``offset``, a ``CheckedPage``): only the other members' rules run, in field
    order and with ``build``'s messages, and the value is made with
    ``sheetplane._types.unchecked``."""
    members = {**fields, **checked}
    for field in attrs.fields(typing.cast(Any, cls)):
        if field.name not in members and field.default is not attrs.NOTHING:
            default = field.default
            is_factory = isinstance(default, _FACTORY)
            members[field.name] = default.factory() if is_factory else default
        if field.validator is None or field.name in checked or field.name not in members:
            continue
        try:
            field.validator(None, field, members[field.name])
        except Verbatim as exc:
            raise WireError(str(exc)) from None
        except ValueError as exc:
            raise WireError(f"{wire_name(field)} {exc}") from None
    return unchecked(cls, **members)
