"""Reachability: the connection failures that say an endpoint cannot be reached at all.

A refused connection, a host name that does not resolve and a failed TLS handshake are
no outage while nothing at that URL has ever answered: the URL is wrong, or the server
is not running. Before any call has succeeded the client stops the run at the first one
(``UnreachableError``, exit 2) with the URL and the operating system's error; after a
success they are endpoint faults like any other, waited out up to ``--max-outage``.

The openai SDK wraps them in ``APIConnectionError`` (its aiohttp transport even in
``APITimeoutError``), the OS error somewhere down the ``__cause__`` chain: ``unreachable``
walks it. ``preflight`` asks each endpoint for its model list before the first paid call
(a GET that costs nothing): any HTTP answer, even an error, shows the endpoint is there.
"""

from __future__ import annotations

import errno
import socket
import ssl
from collections.abc import Iterable

import anyio
import httpx2
import openai

from ..errors import UnreachableError

__all__ = [
    "PREFLIGHT_S",
    "base_url",
    "os_error",
    "preflight",
    "unreachable",
    "unreachable_error",
]

PREFLIGHT_S = 15.0  # the pre-flight waits no longer than this (a silent host: no verdict)
_NO_ROUTE = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH})


def unreachable(err: BaseException) -> str | None:
    """Why the endpoint cannot be reached, when ``err`` (or an error under it) says so."""
    seen: set[int] = set()
    at: BaseException | None = err
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        if isinstance(at, ConnectionRefusedError):
            return f"connection refused ({at})"
        if isinstance(at, socket.gaierror):
            return f"the host name does not resolve ({at})"
        if isinstance(at, ssl.SSLError):
            return f"the TLS handshake failed ({at})"
        if isinstance(at, OSError) and at.errno in _NO_ROUTE:
            return f"no route to the host ({at})"
        at = at.__cause__ or at.__context__
    return None


def os_error(err: BaseException) -> OSError | None:
    """The operating system's own error under ``err`` (a reset, a refusal), if any: what
    the SDK reports as a timeout may be a connection that broke at once."""
    found: OSError | None = None
    seen: set[int] = set()
    at: BaseException | None = err
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        if isinstance(at, OSError) and not isinstance(at, TimeoutError):
            found = at  # the innermost wins: wrappers (aiohttp's) come first
        at = at.__cause__ or at.__context__
    return found


def unreachable_error(url: str, why: str) -> UnreachableError:
    """The error that stops a run whose endpoint never answered."""
    return UnreachableError(
        "unreachable",
        f"cannot reach {url}: {why}; no call there has succeeded: check --base-url (or "
        "--feedback-base-url), or start the server, then run the same command again",
    )


def base_url(conn: openai.AsyncOpenAI) -> str:
    """An endpoint's base URL as the SDK uses it (OpenAI's when none was given)."""
    return str(conn.base_url).rstrip("/")


async def preflight(conns: Iterable[openai.AsyncOpenAI], timeout: float = PREFLIGHT_S) -> None:
    """Raise UnreachableError for the first endpoint that cannot be reached.

    Each is asked for its model list, which costs nothing: any HTTP answer (an error
    status included) shows something is there; a host that stays silent for ``timeout``
    seconds gives no verdict and is left to the calls.
    """
    for conn in conns:
        try:
            with anyio.fail_after(timeout):
                answer = await conn.get("/models", cast_to=httpx2.Response)
                await answer.aread()
        except openai.APIConnectionError as err:
            why = unreachable(err)
            if why is not None:
                raise unreachable_error(base_url(conn), why) from err
        except (openai.APIStatusError, TimeoutError, httpx2.HTTPError):
            pass  # an answer, or no verdict
