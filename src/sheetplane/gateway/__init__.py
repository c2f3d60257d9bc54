"""The runtime gateway: the HTTP road to a sheet.

``sheetplane.gateway.client`` is the trio client runners use;
``sheetplane.gateway.server`` is the reference gateway (an ASGI app served by
Hypercorn's trio worker); ``sheetplane.gateway.faults`` is the test-fault
protocol both sides share. ``CallBudget`` is the deadline arithmetic of one call
(``_retry``), which the runtime's own retries share.
"""

from ._retry import CallBudget as CallBudget

__all__ = ["CallBudget"]
