"""Input: files read as they come, and their rows made records.

::

    inputs      input formats, streamed: JSONL (gzip, bzip2, xz, zstd), Parquet, CSV
    records     rows made records: fields checked against the job, ids, duplicates
"""

from .records import count_records, read_records

__all__ = ["count_records", "read_records"]
