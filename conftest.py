"""Hypothesis profiles for the whole repository.

``dev`` (the default) explores: every run draws new examples and remembers
failures in ``.hypothesis/``. ``ci`` (``.ci/run`` sets
``SHEETPLANE_HYPOTHESIS_PROFILE=ci``) is derandomized, so a CI run gates on the
same examples every time and a red build is a regression, not a new draw;
exploring further is the job of local runs and ``--campaign``.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("dev")
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.load_profile(os.environ.get("SHEETPLANE_HYPOTHESIS_PROFILE", "dev"))
