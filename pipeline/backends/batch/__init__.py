"""Batch API mode (``--batch``): every round of Self-Refine through ``/v1/batches``.

config   file limits, window and pacing (``REFINE_BATCH_*`` overrides)
api      files and batches at an endpoint (a protocol, and the openai SDK's)
lines    batch input and output lines: building, splitting, reading (pure)
ledger   RUN_DIR/batches.jsonl: what became of every batch
driver   the rounds: fill the window, look at batches in flight, send the next calls
base     the driver's state and bookkeeping
collecting  batches polled, their lines applied as checkpointed steps
sending  the next call of every waiting record, batched within the limits
cancel   `refine cancel`: cancel a run's batches in flight
"""

from .api import (
    BatchAPI,
    BatchClients,
    BatchInfo,
    OpenAIBatchAPI,
    Side,
    check_settings,
    open_clients,
)
from .cancel import acancel, cancel
from .config import BatchConfig
from .driver import run_batches
from .ledger import Ledger, LedgerState, read_ledger

__all__ = [
    "BatchAPI",
    "BatchClients",
    "BatchConfig",
    "BatchInfo",
    "Ledger",
    "LedgerState",
    "OpenAIBatchAPI",
    "Side",
    "acancel",
    "cancel",
    "check_settings",
    "open_clients",
    "read_ledger",
    "run_batches",
]
