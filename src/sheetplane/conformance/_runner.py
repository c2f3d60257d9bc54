"""Run the checks of a profile against one gateway and collect one result per requirement."""

from __future__ import annotations

import secrets
import time
import traceback
from collections.abc import Callable, Collection
from typing import Literal

import attrs
import httpx

from ..budgets import REQUEST_TIMEOUT_MS
from . import _budgets, _checks_seed, _checks_sheetplane, _model, _sessions  # noqa: F401 (register)
from ._context import CHECKS, CheckFailed, CheckSkipped, Context
from ._http import Wire
from ._requirements import Profile, Requirement, selected

__all__ = ["Options", "Report", "Result", "Status", "default_prefix", "run"]

Status = Literal["PASS", "FAIL", "SKIP"]
_MS_PER_S = 1000


def default_prefix() -> str:
    """``conformance_<8 random hex digits>``."""
    return f"conformance_{secrets.token_hex(4)}"


@attrs.frozen
class Options:
    """What one run checks, against what."""

    base_url: str
    token: str = attrs.field(repr=False)
    token_b: str | None = attrs.field(default=None, repr=False)
    profile: Profile = "sheetplane"
    quick: bool = False
    seed: int | None = None
    """The model phase's seed (a random one, printed, when None)."""
    examples: int = 25
    max_seconds: float = 30.0
    namespace_prefix: str | None = None
    only: Collection[str] | None = None
    """Requirement ids to check (the rest are not run at all); None: the whole profile."""
    stall_limit_ms: int = REQUEST_TIMEOUT_MS
    budget_limit_ms: int = REQUEST_TIMEOUT_MS
    transport: httpx.BaseTransport | None = attrs.field(default=None, repr=False)
    """Replaces the network (the kit's own tests wrap the real one to make mutants)."""


@attrs.frozen
class Result:
    """One requirement's verdict."""

    requirement: Requirement
    status: Status
    detail: str
    """The evidence of a FAIL, the reason of a SKIP, empty for a PASS."""
    seconds: float


@attrs.frozen
class Report:
    """Every result of one run."""

    results: tuple[Result, ...]
    profile: Profile
    prefix: str
    seed: int
    seconds: float
    token_refused: Requirement | None = None
    """The check at which the gateway refused the token (401): the run stopped there,
    and that check's result is not in ``results``."""

    @property
    def passed(self) -> bool:
        """True when no requirement failed (skips do not fail a run) and the token was taken."""
        return self.token_refused is None and all(r.status != "FAIL" for r in self.results)

    def status_of(self, requirement_id: str) -> Status:
        """The verdict of one requirement (``KeyError`` if it was not run)."""
        for result in self.results:
            if result.requirement.id == requirement_id:
                return result.status
        raise KeyError(requirement_id)

    def failed_ids(self) -> list[str]:
        """The ids that failed, in order."""
        return [r.requirement.id for r in self.results if r.status == "FAIL"]


def _client(options: Options) -> httpx.Client:
    return httpx.Client(
        base_url=options.base_url.rstrip("/"),
        timeout=REQUEST_TIMEOUT_MS / _MS_PER_S,
        transport=options.transport,
        follow_redirects=False,
    )


def _verdict(requirement: Requirement, ctx: Context, options: Options) -> tuple[Status, str]:
    if requirement.slow and options.quick:
        return "SKIP", "--quick skips the checks that take real time"
    if requirement.needs_token_b and ctx.wire_b is None:
        return "SKIP", "needs a second org's token (--token-b)"
    try:
        CHECKS[requirement.id](ctx)
    except CheckFailed as failure:
        return "FAIL", failure.evidence()
    except CheckSkipped as skip:
        return "SKIP", str(skip)
    except httpx.HTTPError as exc:
        return "FAIL", f"expected an HTTP answer; got {type(exc).__name__}: {exc}"
    except Exception as exc:  # a malformed answer the check did not foresee
        last = ctx.wire.exchanges[-1].describe() if ctx.wire.exchanges else "no request made"
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return "FAIL", (
            f"expected an answer of the documented shape; the check broke on it "
            f"({type(exc).__name__}: {exc} at {where.name}:{where.lineno}); last {last}"
        )
    return "PASS", ""


def run(options: Options, on_result: Callable[[Result], None] | None = None) -> Report:
    """Check every requirement of ``options.profile`` (or ``options.only``) in order.

    A check whose request with the token is answered 401 ends the run there: every
    further check would fail the same way (``Report.token_refused``)."""
    prefix = options.namespace_prefix or default_prefix()
    seed = options.seed if options.seed is not None else secrets.randbelow(2**32)
    requirements = [
        r for r in selected(options.profile) if options.only is None or r.id in options.only
    ]
    start = time.monotonic()
    results: list[Result] = []
    with _client(options) as client:
        wire = Wire(options.base_url, options.token, prefix, client)
        wire_b = (
            None
            if options.token_b is None
            else Wire(options.base_url, options.token_b, prefix, client)
        )
        ctx = Context(
            wire=wire,
            wire_b=wire_b,
            prefix=prefix,
            profile=options.profile,
            quick=options.quick,
            seed=seed,
            examples=options.examples,
            max_seconds=options.max_seconds,
            stall_limit_ms=options.stall_limit_ms,
            budget_limit_ms=options.budget_limit_ms,
        )
        for requirement in requirements:
            began = time.monotonic()
            status, detail = _verdict(requirement, ctx, options)
            if status == "FAIL" and wire.token_refused:
                return Report(
                    tuple(results),
                    options.profile,
                    prefix,
                    seed,
                    time.monotonic() - start,
                    token_refused=requirement,
                )
            result = Result(requirement, status, detail, time.monotonic() - began)
            results.append(result)
            if on_result is not None:
                on_result(result)
    return Report(tuple(results), options.profile, prefix, seed, time.monotonic() - start)
