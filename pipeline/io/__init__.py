"""Input and output files: reading records in, exporting and merging runs out.

::

    inputs      input formats, streamed: JSONL (gzip, bzip2, xz, zstd), Parquet, CSV
    records     rows made records: fields checked against the job, ids, duplicates
    columns     outputs as typed columns
    export      `refine export`: outputs (and input columns) as Parquet, CSV or JSONL
    merge       `refine merge`: the run directories of --shard runs as one
"""

from .export import ExportSummary
from .merge import MergeSummary
from .records import count_records, read_records

__all__ = ["ExportSummary", "MergeSummary", "count_records", "read_records"]
