"""What a backend is: the protocol the runner calls, whichever backend the settings name.

A run goes through four steps, each a method, so that ``runner`` never asks which
backend it has::

    check(settings)        refuse what it cannot serve, before a model is started or a
                           cent spent (ConfigError naming the option)
    open(session, plan)    its driver over the run's session, with the clients it needs
                           opened on the plan's endpoints (and closed after), no others
    driver.preflight()     a free request to each endpoint it opened (UnreachableError)
    driver.run()           the session's records, until done, stopped or detached

and ``driver.counts()`` reports its clients' calls, retries and rate-limit refusals for
progress and the summary at any moment. An error that stops the run is raised from
``preflight`` or ``run`` as a ``RefineError``, or set on ``session.halting``.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol

from ..runs.clients import ClientPlan
from ..runs.session import CallCounts, Session
from ..runs.settings import Settings

__all__ = ["Backend", "Driver"]


class Driver(Protocol):
    """A run's records in motion, over one session, with the clients its backend opened."""

    async def preflight(self) -> None:
        """Raise UnreachableError when an endpoint it opened cannot be reached at all."""
        ...

    async def run(self) -> None:
        """Run the session's records until every one is done, the run stops, or it detaches."""
        ...

    def counts(self) -> CallCounts:
        """Its clients' calls, retries and rate-limit refusals so far."""
        ...


class Backend(Protocol):
    """A way to drive a run's records, chosen by name (``pipeline.backends.named``)."""

    @property
    def name(self) -> str:
        """The name it is chosen by: its folder under ``pipeline/backends/``."""
        ...

    @property
    def opens_clients(self) -> bool:
        """Whether it opens its clients on the run's endpoints (False: it was given them,
        and the run needs no API key)."""
        ...

    def check(self, settings: Settings) -> None:
        """Refuse settings it cannot serve (ConfigError), before anything is started."""
        ...

    def open(self, session: Session, plan: ClientPlan) -> AbstractAsyncContextManager[Driver]:
        """Its driver over ``session``, with the clients it needs; they close on exit."""
        ...
