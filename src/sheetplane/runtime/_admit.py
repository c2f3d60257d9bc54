"""Admission's one owner: ``admit`` chooses the way an input goes in, and takes it.

``RowWriter.start`` calls ``admit`` once. The ways in, and when each is taken:

* **whole** (``_whole``): the gateway admits only whole inputs (a gateway built
  to the runtime, which answers the staged begin "Unsupported runtime
  data-plane action"): one ``start_sheet_dataset``, on both roads;
* **one transaction** (``store/_direct.py``): the direct road, when the input is
  a sequence (it can be read again, so the one transaction can always give way
  to the staged road) and the sheet holds no rows yet. The rows are written
  once, straight into the sheet by ``COPY``, in one transaction of a
  ``rows.admit`` session that holds the sheet's writer lock throughout;
* **staged** (``sheetplane.admission``, ``store/_staging.py``): everything else.
  The gateway road always (its chunks arrive in separate requests, possibly at
  different gateway processes, so no transaction can span them); on the direct
  road, a one-shot input, an iterator or an async iterable (its size and pace
  are unknown: one that outran the transaction's bound,
  ``DIRECT_ADMISSION_HOLD_MS``, could not be read again, and an async one may
  wait on anything while the transaction holds the writer lock), a sheet that
  already holds rows (re-admitting moves rows' status and version, which only
  the gateway's statements do), and a sequence whose one transaction ran past
  ``DIRECT_ADMISSION_HOLD_MS`` (it is rolled back and the sequence is staged
  from its start).

The owner asks no road which it is: what differs is behind the writer's
admission road (``pages.AdmissionRoad``, picked once by ``Runtime.writer``).
It offers every sequence to ``admit_at_once`` (the direct road's one
transaction; the gateway road has none and answers None), stages through the
road's ``stage_chunk`` (a scoped session's ``INSERT``, or the gateway's
request), and opens a whole admission's parts with the road's ``whole_part``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import _tracing
from .._types import InlineAdmission
from ..admission import Admission, AdmissionInput, StagedAdmission, check_input
from ..errors import STAGING_LOST_TEXT, AdmissionStateError, UnsupportedActionError
from ..pages import BEGIN_ADMISSION
from ._whole import Tape, admit_whole, whole_admission

if TYPE_CHECKING:
    from ._writer import WriteTarget

__all__ = ["BEGIN_ADMISSION", "admit"]


async def admit(target: WriteTarget, rows: AdmissionInput) -> Admission:
    """Admit ``rows`` to the target's sheet under a new write version, the way the
    module docstring says; the ``Admission`` of what was committed."""
    check_input(rows)
    t = target
    if _rereadable(rows) and t.client.serves(BEGIN_ADMISSION) is not False:
        assert isinstance(rows, Sequence)
        counts = await t.admissions.admit_at_once(rows)
        if counts is not None:
            _tracing.annotate({"sheetplane.admission.way": "one_transaction"})
            return Admission.from_counts(
                counts, t.admitted, play_name=t.sheet.play_name, run_id=t.run_id
            )
    served = t.client.serves(BEGIN_ADMISSION)  # known now if the road probed for it
    if served is False:
        _tracing.annotate({"sheetplane.admission.way": "whole"})
        return _whole_admission(t, await _whole(t, Tape(rows, lambda: True).replay()))
    _tracing.annotate({"sheetplane.admission.way": "staged"})
    return await _staged(t, rows, served)


async def _staged(t: WriteTarget, rows: AdmissionInput, served: bool | None) -> Admission:
    """The staged way (``sheetplane.admission``), or whole if the begin is refused."""
    staged = StagedAdmission(
        client=t.client,
        sheet=t.sheet,
        contract=t.contract,
        run_id=t.run_id,
        road=t.admissions,
    )
    # Until the gateway is known to stage, keep what the staged attempt reads, so
    # a gateway that admits only whole inputs gets the whole input (``_whole``). A
    # sequence needs no keeping: it is read again from its start.
    tape = Tape(rows, lambda: t.client.serves(BEGIN_ADMISSION) is None)
    taped = served is None and not _rereadable(rows)
    try:
        try:
            counts = await staged.run(tape.play() if taped else rows)
        except AdmissionStateError as exc:
            # The staging rows were lost (a database restart empties the unlogged
            # staging table; the next chunk or the commit finds it). A sequence
            # can be read again: the admission starts over once, as a new one.
            # A one-shot iterator cannot: the error is the caller's.
            if STAGING_LOST_TEXT not in str(exc) or not _rereadable(rows):
                raise
            counts = await staged.run(rows)  # a new admission id, from the start
    except UnsupportedActionError:
        if served is not None or t.client.serves(BEGIN_ADMISSION) is not False:
            raise
        return _whole_admission(t, await _whole(t, tape.replay()))
    finally:
        t.admissions.staging_done()
    return Admission.from_counts(counts, t.admitted, play_name=t.sheet.play_name, run_id=t.run_id)


async def _whole(t: WriteTarget, rows: AsyncIterator[Mapping[str, Any]]) -> InlineAdmission:
    return await admit_whole(t.client, t.sheet.table_namespace, t.contract, rows, t.run_id)


def _whole_admission(t: WriteTarget, inline: InlineAdmission) -> Admission:
    return whole_admission(
        inline, t.admissions.whole_part, play_name=t.sheet.play_name, run_id=t.run_id
    )


def _rereadable(rows: object) -> bool:
    """Whether an admission input can be read again from its start: a sequence."""
    return isinstance(rows, Sequence) and not isinstance(rows, str | bytes)
