"""The Ray backend (``--workers N``): the run's records on worker actors, chosen by name."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from ...runs.clients import ClientPlan
from ...runs.session import Session
from ...runs.settings import Settings
from .connect import require_ray
from .driver import RayDriver

__all__ = ["RayBackend"]


class RayBackend:
    """Worker actors open their own clients (clients cannot be pickled); this process none."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return "ray"

    @property
    def opens_clients(self) -> bool:
        return True

    def check(self, settings: Settings) -> None:
        """Refuse the run when Ray is not installed (ConfigError saying how to install it)."""
        require_ray()

    @contextlib.asynccontextmanager
    async def open(self, session: Session, plan: ClientPlan) -> AsyncIterator[RayDriver]:
        """The driver; the workers open their clients when they start."""
        yield RayDriver(session, plan)
