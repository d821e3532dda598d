"""Commands over a run directory or a plan, beside ``refine run`` itself.

::

    status      done/failed/pending, calls, tokens (cached among them), cost, batches
    show        one record's calls in order, each request rebuilt exactly as sent
    estimate    calls, tokens, the cached share and dollars of a run, before it spends
    fit         the records whose prompt cannot fit the model's context window
    jobs        refine jobs: the built-in jobs listed, or one job checked and described
    calibrate   refine, sample, or stop? a labelled sample run as each arm, compared
    arms        the arms at equal budget: sizing best-of-n, reading their run directories
    calibration calibration.json: the rounds, the arms, the plan a later run reads
    export      outputs (and input columns) as Parquet, CSV or JSONL
    columns     output fields as typed columns, for export
    merge       the run directories of --shard runs joined as one
    cancel      refine cancel: a --batch run's batches in flight cancelled (its records
                stay resumable)
    sandbox     the isolation model-written programs get here, and a self-test under it
"""

from .estimate import Estimate, run_estimate
from .status import collect, render

__all__ = ["Estimate", "collect", "render", "run_estimate"]
