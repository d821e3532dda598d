"""A `refine` that dies (SIGKILL) while it compacts its journal, for crash tests.

``python -m tests.journal_faults POINT N ARGS...`` runs ``refine ARGS...`` and kills the
process, as a power cut would, in its Nth compaction of the journal (N counts from 1) at
POINT:

    before_replace   the journal without the finished records is written and synced beside
                     the old one, not yet renamed over it
    after_replace    renamed over it, the directory not yet synced

With ``eager`` as N's suffix (``2eager``), the journal compacts whenever its finished
records' entries outweigh the rest, with no floor, so a short run compacts mid-way.
The production code has no crash point: the process dies here, in the test's patches.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from unittest import mock

from pipeline.cli import main as refine
from pipeline.runs import journal as store

POINTS = ("before_replace", "after_replace")


def die() -> None:
    """End the process at once, as SIGKILL does: no cleanup, no flush."""
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: Sequence[str]) -> int:
    """Run ``refine ARGV[2:]``, dying in compaction ARGV[1] at point ARGV[0]."""
    point, nth, *args = argv
    if point not in POINTS:
        raise SystemExit(f"journal_faults: POINT must be one of {', '.join(POINTS)}")
    eager = nth.endswith("eager")
    left = [int(nth.removesuffix("eager"))]
    replace, fsync_dir = os.replace, store._fsync_dir

    def replacing(src: str | Path, dst: str | Path) -> None:
        if not str(src).endswith(".compact"):  # another file's rewrite
            return replace(src, dst)
        left[0] -= 1
        if left[0] == 0 and point == "before_replace":
            die()
        replace(src, dst)

    def syncing(path: Path) -> None:
        if left[0] == 0 and point == "after_replace":
            die()
        fsync_dir(path)

    with (
        mock.patch.object(os, "replace", replacing),
        mock.patch.object(store, "_fsync_dir", syncing),
        mock.patch.object(store, "COMPACT_MIN_BYTES", 0 if eager else store.COMPACT_MIN_BYTES),
    ):
        return refine(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
