"""Worker threads whose errors leave without the frames that raised them.

An error raised deep in a worker thread (a refused write, a bad row, a read
past its budget, a Postgres error) holds, through its traceback, every frame
it passed, and each frame its caller's: the rows the thread was given and
those it made. Re-raised on the trio side it gains the request's frames too
(the gateway's holds the raw body), and trio's ``to_thread`` machinery (the
closure that hands the thread's outcome back) and any frame that keeps the
outcome make a reference cycle of it: all of it stays until Python's cyclic
collector runs. A burst of refused large requests then piles up their bodies.

Here an error leaves the thread as an outcome, with no traceback on it or on
any error it chains (cause, context): where it was raised is kept as the
traceback's text (each frame's file, line and function), a note of each
error (so a logged traceback still shows the thread's frames; formatting
it reads no source file), and the frames go when the thread's function
returns.
``unwrap`` raises it on the trio side with no frame of the raise keeping it,
so the trio-side frames go as soon as whoever handles the error drops it.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, TypeVar

import outcome
import trio

__all__ = ["call_frameless", "frameless", "run_sync", "unwrap"]

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)

#: The note that carries an error's traceback once its frames are dropped.
THREAD_TRACEBACK_NOTE: Final = "Traceback in the worker thread (most recent call last):\n"


def frameless(error: E) -> E:
    """``error``, with its traceback and those of every error it chains (``__cause__``,
    ``__context__``) dropped, each traceback kept as a note of its error."""
    pending: list[BaseException] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        tb = current.__traceback__
        if tb is not None:
            current.add_note(THREAD_TRACEBACK_NOTE + _where(tb))
            current.__traceback__ = None
            del tb
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return error


def _where(tb: TracebackType) -> str:
    """The frames of ``tb`` as a traceback names them, without their source lines:
    formatting reads no file (``linecache`` would load each frame's whole source,
    on a path every refusal takes)."""
    return "\n".join(
        f'  File "{frame.f_code.co_filename}", line {lineno}, in {frame.f_code.co_name}'
        for frame, lineno in traceback.walk_tb(tb)
    )


def call_frameless(fn: Callable[..., T], *args: Any) -> outcome.Outcome[T]:
    """``fn(*args)`` as an outcome, in the calling thread; its error ``frameless``."""
    try:
        return outcome.Value(fn(*args))
    except Exception as exc:
        return outcome.Error(frameless(exc))


def unwrap(result: outcome.Outcome[T]) -> T:
    """``result``'s value, or raise its error: no frame of the raise keeps the outcome
    (a frame that did would be in the error's traceback: a cycle)."""
    try:
        return result.unwrap()
    finally:
        del result


async def run_sync(fn: Callable[..., T], *args: Any) -> T:
    """``trio.to_thread.run_sync(fn, *args)``, whose error leaves ``frameless``."""
    return unwrap(await trio.to_thread.run_sync(call_frameless, fn, *args))
