"""``refine report``: a run's figures as Markdown with PNG plots, and as one offline HTML page.

One streaming pass over the run directory (:mod:`.source`) feeds the figures
(:mod:`.aggregate`), the answers each refinement round made better or worse
(:mod:`.flips`, with the rule of :mod:`.payoff`: does a round pay?) and the record
browser's data (:mod:`.browser`); the same text
blocks (:mod:`.document`) become ``report.md`` (:mod:`.markdown`) and ``index.html``
(:mod:`.html`), with plots drawn by matplotlib (:mod:`.plots`, the ``report`` extra).
Arms compared on the same records (:mod:`.comparison`: the best, the detectably worse, the
one to run) rest on :mod:`.significance` (Wilson intervals, McNemar's exact test, the
records that would tell), for ``refine calibrate``.
"""

from .aggregate import SAMPLE_SIZE, Cell, Distribution, Measure, RunReport, Spend, summarize
from .browser import DETAIL_LIMIT, INDEX_LIMIT
from .markdown import render_markdown
from .source import read_ids
from .writer import ReportFiles, write_report

__all__ = [
    "DETAIL_LIMIT",
    "INDEX_LIMIT",
    "SAMPLE_SIZE",
    "Cell",
    "Distribution",
    "Measure",
    "ReportFiles",
    "RunReport",
    "Spend",
    "read_ids",
    "render_markdown",
    "summarize",
    "write_report",
]
