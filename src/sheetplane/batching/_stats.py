"""The batcher's statistics snapshot."""

from __future__ import annotations

import attrs


@attrs.frozen
class BatcherStatistics:
    """A snapshot of one ``BoundedBatchFunction``, as returned by ``stats()``.

    Counters (``batches``, ``values``, ``wedged``, ...) only grow; the other
    fields describe the moment the snapshot was taken.
    """

    batches: int
    """Batches handed to ``execute`` so far."""
    values: int
    """Values handed to ``execute`` so far."""
    peak_retained_items: int
    """The most values ever retained at once (queued plus in flight)."""
    peak_retained_bytes: int
    """The most estimated bytes ever retained at once (queued plus in flight)."""
    peak_in_flight: int
    """The most ``execute`` calls ever running at once."""
    retained_items: int
    """Values retained now: queued in a lane or part of a running batch."""
    retained_bytes: int
    """Estimated bytes retained now."""
    queued: int
    """Values waiting in a lane for their batch to start."""
    waiting_for_admission: int
    """Callers waiting for room under the retention caps."""
    in_flight: int
    """``execute`` calls running now."""
    lanes: int
    """Lanes that hold at least one queued value."""
    wedged: int
    """Values whose ``max_wait`` passed before their batch started (``LaneWedgedError``)."""
    withdrawn: int
    """Values withdrawn because their caller was cancelled before the batch started."""
    abandoned_batches: int
    """Batches whose every caller left while they ran, so their cancel scope was cancelled."""
