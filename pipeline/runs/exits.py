"""The exit status of a ``refine`` command, by what happened (README's table).

Its own module, so the command line can say how it ends without loading a run's machinery.
"""

from __future__ import annotations

__all__ = ["EXIT"]

EXIT = {
    "ok": 0,  # every input line became a record and every record is done
    "partial": 1,  # some records failed, or some input lines could not be read
    "config": 2,  # bad usage or configuration (also: unknown model, RUN_DIR in use)
    "auth": 3,  # the endpoint refused the API key
    "store": 4,  # the run directory cannot be written (disk full, read-only)
    "unavailable": 5,  # the endpoint stayed down longer than --max-outage
    "budget": 6,  # --budget reached; resumable with a larger budget
    "detached": 75,  # --batch --detach: batches in flight; run the same command again
    "interrupted": 130,  # SIGINT/SIGTERM: stopped cleanly, resumable
}
