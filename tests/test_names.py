"""Play names and table namespaces normalised as identities (sheetplane.names)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sheetplane import InvalidInputError, normalize_play_name, normalize_table_namespace
from sheetplane.budgets import MAX_LOGICAL_NAME_CHARS


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("NormTest", "normtest"),
        (" NormTest ", "normtest"),
        ("\tnormtest\n", "normtest"),
        ("\u00a0Leads\u3000", "leads"),  # non-ASCII whitespace is trimmed too
        ("Two  Words", "two  words"),  # inner whitespace is kept
        ("a-b", "a-b"),
        ("a_b", "a_b"),
        ("E\u0301MAILS", "\u00e9mails"),  # NFD composed, then lower-cased
        ("\u00c9mails", "\u00e9mails"),
        ("名前", "名前"),
        ('"; DROP TABLE x; --', '"; drop table x; --'),
    ],
)
def test_the_rule(raw: str, normalised: str) -> None:
    assert normalize_table_namespace(raw) == normalised
    assert normalize_play_name(raw) == normalised


@pytest.mark.parametrize(
    "bad",
    ["", "   ", "\t\n", "\u3000", "a\x00b", "\ud800", "x" * (MAX_LOGICAL_NAME_CHARS + 1), 3, None],
)
def test_names_that_are_not_identities_are_refused(bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="table_namespace"):
        normalize_table_namespace(bad)
    with pytest.raises(InvalidInputError, match="play_name"):
        normalize_play_name(bad)


@given(st.text(max_size=40))
def test_normalising_is_idempotent(raw: str) -> None:
    try:
        once = normalize_table_namespace(raw)
    except InvalidInputError:
        return
    assert normalize_table_namespace(once) == once
    assert once == once.strip()
