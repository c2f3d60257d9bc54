"""Whether a terminal write's result proves the writer superseded: pure, shared by both roads.

A terminal write answers which rows it committed and which it found stale, and
why (``TerminalWriteResult``). Any stale row but the benign ``already_terminal``
ones means a newer (or older) admission owns the row: the attempt is
superseded and stops (``AttemptSupersededError``).
"""

from __future__ import annotations

from collections.abc import Iterable

from ._types import BENIGN_STALE_REASONS, StaleRow, TerminalWriteResult
from .errors import AttemptSupersededError

__all__ = ["raise_if_superseded", "superseded_error", "superseded_rows"]


def superseded_rows(
    result: TerminalWriteResult, except_keys: Iterable[str] = ()
) -> tuple[StaleRow, ...]:
    """The stale rows that prove the writer no longer owns the sheet.

    Every stale row except the benign ``already_terminal`` ones and the keys
    in ``except_keys`` (which the caller verified as idempotent settlements).
    A key reported twice counts once.
    """
    excluded = set(except_keys)
    seen: set[str] = set()
    rows = []
    for row in result.stale_rows:
        if row.key in excluded or row.key in seen or row.reason in BENIGN_STALE_REASONS:
            continue
        seen.add(row.key)
        rows.append(row)
    return tuple(rows)


def superseded_error(
    result: TerminalWriteResult,
    *,
    table_namespace: str,
    run_id: str,
    write_version: int | None,
    submitted_rows: int | None = None,
    except_keys: Iterable[str] = (),
) -> AttemptSupersededError | None:
    """The ``AttemptSupersededError`` a terminal write's result calls for, or ``None``.

    ``submitted_rows`` defaults to the distinct keys the result accounts for
    (committed and stale together: every key a write carried is one or the other).
    """
    rows = superseded_rows(result, except_keys)
    if not rows:
        return None
    if submitted_rows is None:
        submitted_rows = len({*result.committed_keys, *result.stale_keys})
    return AttemptSupersededError(table_namespace, run_id, write_version, submitted_rows, rows)


def raise_if_superseded(
    result: TerminalWriteResult,
    *,
    table_namespace: str,
    run_id: str,
    write_version: int | None,
    except_keys: Iterable[str] = (),
) -> None:
    """Raise ``superseded_error``'s error when the result has one."""
    error = superseded_error(
        result,
        table_namespace=table_namespace,
        run_id=run_id,
        write_version=write_version,
        except_keys=except_keys,
    )
    if error is not None:
        raise error
