"""Backends: the ways to drive a run's records, each an object chosen by name.

::

    protocol    Backend (check, open) and the Driver it opens (preflight, run, counts)
    realtime    the default: up to --concurrency records in flight through a pool
    batch       --batch: every call through the Batch API, in rounds
    ray         --workers N: Ray worker actors, one rate limit and budget across them

``named(name)`` imports ``pipeline.backends.<name>`` and builds its ``backend_class``;
``chosen(settings)`` is the one line that maps the run's options to a name. Each backend
depends on the run's public types (``pipeline.runs``), never on the runner that looks it
up, nor on another backend. Importing this package imports none of them (Ray is an
optional extra). The embedded llama.cpp model (--local) is an endpoint, not a backend:
``pipeline.serving``.
"""

from __future__ import annotations

from importlib import import_module

from ..runs.settings import Settings
from .protocol import Backend, Driver

__all__ = ["Backend", "Driver", "chosen", "name_of", "named"]


def name_of(settings: Settings) -> str:
    """The name of the backend the settings ask for."""
    return "batch" if settings.batch else "ray" if settings.workers is not None else "realtime"


def named(name: str) -> Backend:
    """The backend ``pipeline.backends.<name>``, built with its defaults."""
    module = import_module(f"{__name__}.{name}")
    backend: Backend = module.backend_class()
    return backend


def chosen(settings: Settings) -> Backend:
    """The backend the settings ask for."""
    return named(name_of(settings))
