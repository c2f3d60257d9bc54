"""sheetplane.testing: exercise a runner or a gateway against the reference data plane.

* :mod:`sheetplane.testing.plugin`: a pytest plugin (installed as the
  ``pytest11`` entry point ``sheetplane``) with fixtures for a real Postgres,
  a running reference gateway with test faults allowed, and a runtime
  context on either road;
* :mod:`sheetplane.testing.strategies`: Hypothesis strategies for sheet
  contracts, rows (hostile ones included), page requests and fault schedules;
* :mod:`sheetplane.testing.models`: the plain reference models the state
  machines and the chaos harness compare the real thing with.

See docs/testing.md. Nothing is imported here, so ``import sheetplane.testing``
needs neither pytest nor Hypothesis.
"""
