"""The batch backend (``--batch``): every round of Self-Refine through a provider's batches
(OpenAI's Batch API, ``/v1/batches``; Anthropic's Message Batches).

::

    backend  BatchBackend: chosen by name, it refuses the local model and opens the driver
    driver   BatchDriver, the rounds: fill the window, look at batches, send the next calls
    window   the records the driver holds, their next calls and their batches
    control  the paced control requests, their outage, finding batches and files again
    api      files and batches at an endpoint (a protocol, and the openai SDK's), by side
    anthropic  Message Batches in the protocol's shape (inline requests, results by custom_id)
    opening  the provider's batch API for each side (BATCH_APIS)
    lines    batch input and output lines: building, splitting, reading (pure)
    ledger   RUN_DIR/batches.jsonl: what became of every batch
    config   file limits, window and pacing (``REFINE_BATCH_*`` overrides)

``refine cancel`` (``pipeline.commands.cancel``) uses the api and the ledger.
"""

import importlib
from typing import TYPE_CHECKING, Any

from .config import BatchConfig
from .ledger import Entry, Ledger, LedgerState, read_ledger

if TYPE_CHECKING:
    from .anthropic import AnthropicBatchAPI
    from .api import (
        BatchAPI,
        BatchInfo,
        OpenAIBatchAPI,
        Side,
        Sides,
        find_by_token,
        find_upload,
        input_file_name,
    )
    from .backend import BatchBackend
    from .driver import BatchDriver
    from .opening import open_sides

    backend_class = BatchBackend

# Imported when first asked for (PEP 562): these bring an HTTP SDK, which reading a
# run's ledger (refine status) never needs.
_FROM_API = "BatchAPI BatchInfo OpenAIBatchAPI Side Sides find_by_token find_upload input_file_name"
_LAZY = {
    **dict.fromkeys(_FROM_API.split(), ".api"),
    "AnthropicBatchAPI": ".anthropic",
    "open_sides": ".opening",
    "BatchBackend": ".backend",
    "BatchDriver": ".driver",
}


def __getattr__(name: str) -> Any:
    if name == "backend_class":  # what ``pipeline.backends.named("batch")`` builds
        return __getattr__("BatchBackend")
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where, __name__), name)


__all__ = [
    "AnthropicBatchAPI",
    "BatchAPI",
    "BatchBackend",
    "BatchConfig",
    "BatchDriver",
    "BatchInfo",
    "Entry",
    "Ledger",
    "LedgerState",
    "OpenAIBatchAPI",
    "Side",
    "Sides",
    "backend_class",
    "find_by_token",
    "find_upload",
    "input_file_name",
    "open_sides",
    "read_ledger",
]
