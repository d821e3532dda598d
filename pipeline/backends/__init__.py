"""Backends: other ways to drive a run's records than the real-time pool.

::

    batch       --batch: every call through the Batch API, in rounds; `refine cancel`
    cluster     --workers N: Ray worker actors, one rate limit and budget across them

The embedded llama.cpp model (--local) is an endpoint, not a backend: ``pipeline.serving``.

Each depends on the run's public types (``pipeline.runs``), never on the module that
picks a backend (``pipeline.runner``). Import the one you need: Ray is an optional extra.
"""

__all__: list[str] = []
