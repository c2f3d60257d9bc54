"""The one exception-group collapse every library-owned nursery uses."""

from __future__ import annotations

import pytest

from sheetplane._groups import raise_single, single_error


def test_a_nest_of_single_groups_yields_its_one_error() -> None:
    leaf = KeyError("only")
    nest = BaseExceptionGroup("outer", [ExceptionGroup("inner", [leaf])])
    assert single_error(nest) is leaf
    assert single_error(leaf) is leaf


def test_a_group_of_several_errors_is_kept_whole() -> None:
    group = ExceptionGroup("two", [ValueError("a"), ExceptionGroup("b", [KeyError("b")])])
    assert single_error(group) is group
    with pytest.raises(ExceptionGroup) as raised:
        raise_single(group)
    assert raised.value is group


def test_the_single_error_is_raised_with_its_own_cause() -> None:
    cause = OSError("connection reset")
    leaf = RuntimeError("write failed")
    leaf.__cause__ = cause
    with pytest.raises(RuntimeError) as raised:
        raise_single(ExceptionGroup("nursery", [leaf]))
    assert raised.value is leaf
    assert raised.value.__cause__ is cause
