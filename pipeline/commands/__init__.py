"""Commands that read or plan a run without driving one: ``refine status`` and ``estimate``.

::

    status      done/failed/pending, calls, tokens (cached among them), cost, batches
    estimate    calls, tokens, the cached share and dollars of a run, before it spends
"""

from .estimate import Estimate, run_estimate
from .status import collect, render

__all__ = ["Estimate", "collect", "render", "run_estimate"]
