"""The real-time backend (the default): every call made as a record's loop asks for it.

::

    driver      RealTimeBackend (clients given or opened) and its driver
    pool        up to --concurrency tasks in flight from a bounded stream
"""

from .driver import RealTimeBackend, RealTimeDriver
from .pool import run_pool

backend_class = RealTimeBackend  # what ``pipeline.backends.named("realtime")`` builds

__all__ = ["RealTimeBackend", "RealTimeDriver", "backend_class", "run_pool"]
