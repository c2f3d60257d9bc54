"""The runtime gateway: the HTTP road to a sheet.

``sheetplane.gateway.client`` is the trio client runners use;
``sheetplane.gateway.server`` is the reference gateway (an ASGI app served by
Hypercorn's trio worker); ``sheetplane.gateway.faults`` is the test-fault
protocol both sides share.
"""
