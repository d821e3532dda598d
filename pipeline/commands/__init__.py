"""Commands over a run directory or a plan, beside ``refine run`` itself.

::

    status      done/failed/pending, calls, tokens (cached among them), cost, batches
    estimate    calls, tokens, the cached share and dollars of a run, before it spends
    calibrate   refine, sample, or stop? a labelled sample run as each arm, compared
    arms        the arms at equal budget: sizing best-of-n, reading their run directories
    calibration calibration.json: the rounds, the arms, the plan a later run reads
    export      outputs (and input columns) as Parquet, CSV or JSONL
    columns     output fields as typed columns, for export
    merge       the run directories of --shard runs joined as one
"""

from .estimate import Estimate, run_estimate
from .status import collect, render

__all__ = ["Estimate", "collect", "render", "run_estimate"]
