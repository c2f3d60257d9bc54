"""sheetplane.conformance: check any runtime gateway against numbered requirements.

``sheetplane conformance URL --token T`` (``_command``) runs the checks of a
profile (``_requirements``: every requirement with the sentence it comes
from) over raw HTTP (``_http``: literal JSON, no shared wire classes), the
scoped sessions with psycopg (``_sessions``), the timed budgets over raw
sockets (``_budgets``) and a Hypothesis state machine beside
``sheetplane.testing.models`` (``_model``), and reports each verdict
(``_report``: lines, JUnit XML, JSON). See docs/conformance.md.
"""

from __future__ import annotations

from ._command import add_conformance_parser as add_conformance_parser
from ._requirements import REQUIREMENTS as REQUIREMENTS
from ._requirements import Requirement as Requirement
from ._runner import Options as Options
from ._runner import Report as Report
from ._runner import Result as Result
from ._runner import run as run

__all__ = [
    "REQUIREMENTS",
    "Options",
    "Report",
    "Requirement",
    "Result",
    "add_conformance_parser",
    "run",
]
