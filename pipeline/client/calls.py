"""One model call over HTTP, paced, paid for, retried and timed out, whatever the dialect.

``ChatClient`` is what the OpenAI client (``chat.OpenAIClient``) and Anthropic's
(``anthropic.AnthropicClient``) share: the loop around one call. The one retry layer is
the call's retry sequence (``attempts.Attempts``), which after each failed attempt says
whether to step down the format ladder, retry, fail the record or stop the run; this loop
does what it says and waits its delays. Before asking it, the endpoint's own refusals are
handled (a dialect's field the endpoint does not take, the flex tier's lack of capacity, a
URL that never answered). Every attempt is paced by the run's limiter, reserved against
its budget first, and cut off at ``timeout`` seconds, the whole answer included. While an
endpoint is in an outage its calls wait for one-at-a-time probes (``_probe``).

A dialect says the rest, in the methods a subclass implements: how a request's body is
written (``_body``, ``_probe_body``), how it is sent and what a failure means
(``_send``, raising ``Failed``), how an answer is read (``_answer``), which of its
prompt tokens the provider's input limit counts (``_counted``), and the endpoint's own
refusals (``_refused``). The pieces the loop composes each live in a module of their own:
``attempts``, ``retry``, ``delays``, ``outage``, ``formats``, ``replicas``, ``limits``,
``budget``, ``flex``, ``context``, ``reach``.
"""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Generic, TypeVar

import anyio
import orjson

from ..core.steps import Completion, Request, Try
from ..errors import AuthError, CallError, FatalCallError, UnavailableError
from .attempts import Attempts, FailRecord, HaltRun, Retry
from .budget import Reservation, Spending
from .context import overflow
from .delays import DELAYS, Delays
from .flex import FLEX, Capacity, flex_refused
from .formats import FormatLadder
from .limits import RateLimiter, estimate_tokens
from .outage import FIRST_CONTACT_S, MAX_OUTAGE_S, OUTAGE_AFTER, Outage
from .prices import at_batch_rate
from .reach import unreachable_error
from .replicas import Replica, Replicas
from .replies import redact
from .retry import OutageState, classify_status, endpoint_fault, quota_spent, retry_after

__all__ = ["ChatClient", "Failed", "HttpReply", "Status"]

C = TypeVar("C")  # a dialect's connection to one endpoint


class Failed(Exception):
    """One failed attempt: the failure, the server's Retry-After, and the error's code and
    param (the provider's envelope) when it sent them."""

    def __init__(
        self,
        failure: CallError,
        wait: float | None = None,
        code: str | None = None,
        param: str | None = None,
        unreachable: str | None = None,
    ) -> None:
        self.failure = failure
        self.wait = wait
        self.code = code
        self.param = param
        self.unreachable = unreachable  # why the endpoint cannot be reached at all, if so
        super().__init__(str(failure))


@dataclass(frozen=True, slots=True)
class HttpReply:
    """A successful HTTP answer: its headers and body."""

    headers: Mapping[str, str]
    content: bytes


@dataclass(frozen=True, slots=True)
class Status:
    """An error answer as a dialect read it: what the loop's policy needs of it."""

    status: int
    headers: Mapping[str, str]
    message: str  # the provider's message (its key masked)
    code: str | None = None  # the error's code (OpenAI) or type (Anthropic)
    param: str | None = None  # the request field it names (OpenAI)


class ChatClient(ABC, Generic[C]):
    """A model's endpoint (or several replicas) behind the run's policies, in some dialect."""

    def __init__(
        self,
        *,
        model: str,
        base_url: str | Sequence[str] | None,
        api_key: str | None,
        timeout: float,
        max_retries: int,
        limiter: RateLimiter,
        concurrency: int = 64,
        structured: str = "json_schema",
        grammar: bool = False,
        max_in_flight: int | None = None,
        delays: Delays = DELAYS,
        max_outage: float = MAX_OUTAGE_S,
        budget: Spending | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        request_model: str | None = None,
        service_tier: str | None = None,
        context_tokens: int | None = None,
    ) -> None:
        self._model = model  # the name traces, prices and the budget know it by
        self._request_model = request_model or model  # the name the server knows it by
        self.timeout = timeout
        self.max_retries = max_retries
        self.limiter = limiter
        self.formats = FormatLadder(structured, grammar=grammar)
        self.delays = delays  # every wait between attempts and probes (tests: NO_DELAYS)
        self.budget = budget
        self.service_tier = service_tier  # sent with every call when set (a dialect's field)
        self.context_tokens = context_tokens  # the model's window: a longer prompt is not sent
        self.capacity = Capacity(max_outage, clock, delays.flex)  # the flex tier's refusals
        self.calls = 0
        self.retries = 0
        self.succeeded = 0
        self.probes = 0  # probes of endpoints in an outage (each also counts in ``calls``)
        self._secret = api_key
        self._rng = rng or random.Random()
        self._clock = clock
        self._slots = anyio.Semaphore(max_in_flight) if max_in_flight else None
        urls: Sequence[str | None] = (
            [base_url] if base_url is None or isinstance(base_url, str) else list(base_url)
        ) or [None]
        threshold = min(OUTAGE_AFTER, max_retries + 1)
        connections = max(concurrency, 16) + 16
        self.replicas: Replicas[C] = Replicas(
            [
                Replica(
                    url,
                    self._connect(url, api_key, connections),
                    Outage(max_outage, FIRST_CONTACT_S, clock, threshold=threshold),
                )
                for url in urls
            ],
            clock,
        )

    # -- what a dialect implements -------------------------------------------------------------

    @abstractmethod
    def _connect(self, url: str | None, api_key: str | None, connections: int) -> C:
        """The connection to the endpoint at ``url`` (None: the provider's own)."""

    @abstractmethod
    async def _close(self, conn: C) -> None:
        """Close one endpoint's connections."""

    @abstractmethod
    def _url(self, conn: C) -> str:
        """An endpoint's base URL, as errors name it."""

    @abstractmethod
    async def preflight(self) -> None:
        """Raise UnreachableError for an endpoint that cannot be reached (``reach``)."""

    @abstractmethod
    def _body(
        self, request: Request, level: int, replica: Replica[C]
    ) -> tuple[list[dict[str, str]], bytes]:
        """The messages as sent (in the run's form) and the request body, asking for the
        request's schema (if any) at structured-output ``level``."""

    @abstractmethod
    def _probe_body(self) -> tuple[list[dict[str, str]], bytes]:
        """The outage probe's messages and body: a one-token request of the client's own."""

    @abstractmethod
    async def _send(self, replica: Replica[C], payload: bytes) -> HttpReply:
        """POST ``payload``; the answer, or ``Failed`` (an error status through ``_status``)."""

    @abstractmethod
    def _read_reply(self, data: Any) -> dict[str, Any]:
        """The text, finish reason, usage and service tier of a decoded answer (CallError
        when it is none). Usage: ``prompt_tokens`` (all of them), ``completion_tokens``,
        ``cached_tokens``, and, where the provider writes its cache, ``cache_write_tokens``
        and ``cache_write_1h_tokens``."""

    def _counted(self, usage: Mapping[str, int]) -> int:
        """The prompt tokens the provider's input limit counts (all of them, by default)."""
        return usage["prompt_tokens"]

    def _refused(self, replica: Replica[C], payload: bytes, failed: Failed) -> bool:
        """Whether the endpoint refused a field of the dialect's that ``payload`` (the
        attempt's body) carried and that it does not take, now dropped for the endpoint:
        the call goes again at once, using up no retry (none, by default)."""
        return False

    def _quota_spent(self, status: int, code: str | None, message: str, wait: float | None) -> bool:
        """Whether an error answer says the key's quota or credit is spent (no wait helps)."""
        return quota_spent(status, code, message, wait)

    # -- the client ----------------------------------------------------------------------------

    @property
    def model(self) -> str:
        """The model this client calls, as the run records it (``local:NAME``: embedded)."""
        return self._model

    @property
    def level(self) -> int:
        """The pool's structured-output level (an index into ``formats.LEVELS``)."""
        return self.formats.level

    @property
    def outage(self) -> Outage:
        """The breaker of the first endpoint (the only one, in most runs)."""
        return self.replicas.all[0].outage

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        for replica in self.replicas.all:
            await self._close(replica.conn)

    async def complete(self, request: Request) -> Completion:
        """One model call, retried as the policy allows.

        Raises CallError when the call fails for good (a prompt that cannot fit the context
        window fails unsent), a FatalCallError subclass when the run must stop, and
        BudgetReached when the next attempt cannot be paid for.
        """
        if self.context_tokens is not None:
            too_long = overflow(request.messages, self.context_tokens, self._model)
            if too_long is not None:
                raise too_long
        if self._slots is None:
            return await self._complete(request)
        async with self._slots:
            return await self._complete(request)

    async def _complete(self, request: Request) -> Completion:
        attempts = Attempts(self._model, self.max_retries, self.delays)
        ladder = self.formats if request.schema is not None else None
        refused = 0  # flex refusals waited out (they use up no retry)
        started = self._clock()
        while True:
            replica = self.replicas.pick()
            if replica.outage.open and not await self._probe(replica):
                continue  # still down: wait for the next probe (or another endpoint)
            level = attempts.level(self.formats)
            sent, payload = self._body(request, level, replica)
            replica.in_flight += 1
            sent_at = self._clock()
            try:
                replied = await self._attempt(replica, sent, payload, request.max_tokens)
            except Failed as failed:
                error = failed
            else:
                replica.outage.close(sent_at)
                self.capacity.succeeded()
                self.formats.succeeded(level)
                tries = attempts.succeeded(round(self._clock() - sent_at, 4))
                return self._completion(replied, sent, started, len(attempts.tries), tries)
            finally:
                replica.in_flight -= 1
            failure = error.failure
            attempts.failed(failure, round(self._clock() - sent_at, 4))
            # The endpoint's own refusals first: they are about it, not about the call.
            if self._refused(replica, payload, error):
                continue
            if self.service_tier == FLEX and flex_refused(failure.status, error.code):
                refused += 1
                await self._wait_capacity(failure, refused, attempts, sent)
                continue
            if error.unreachable is not None and self.succeeded == 0:  # a wrong URL: stop
                stop = unreachable_error(self._url(replica.conn), error.unreachable)
                raise attempts.final(stop, sent) from failure
            verdict = attempts.after(
                failure,
                sent,
                level,
                ladder=ladder,
                code=error.code,
                param=error.param,
                wait=error.wait,
                outage=partial(self._breaker, replica, sent_at, error.wait),
                jitter=self._rng.random,
            )
            if isinstance(verdict, FailRecord | HaltRun):
                raise verdict.error from verdict.cause
            if isinstance(verdict, Retry):
                self.retries += 1
                if verdict.counted:
                    await anyio.sleep(verdict.delay)
                # Not counted: the endpoint is in an outage, and the call waits for its
                # probes (or goes to another endpoint) when it comes round again.
            # A StepDown goes again at once, at its lower level.

    async def _wait_capacity(
        self, failure: CallError, refused: int, attempts: Attempts, sent: list[dict[str, str]]
    ) -> None:
        """Wait out a flex refusal; UnavailableError once flex has had no capacity too long."""
        delay = self.capacity.refusal(refused, self._rng.random())
        if self.capacity.exceeded():
            raise attempts.final(self.capacity.unavailable(failure), sent) from failure
        await anyio.sleep(delay)

    def _breaker(
        self, replica: Replica[C], sent_at: float, wait: float | None, failure: CallError
    ) -> OutageState:
        """Count an endpoint fault on the endpoint's breaker; the state the policy sees."""
        outage = replica.outage
        if endpoint_fault(failure):
            outage.failed(sent_at, self.delays.probe_after(outage.probes, self._rng.random(), wait))
        state = outage.state(self.succeeded > 0)
        if state.exceeded and self.replicas.healthy():  # the others carry the run
            return OutageState(open=True)
        return state

    async def _probe(self, replica: Replica[C]) -> bool:
        """Wait for this call's turn to probe an endpoint in an outage, then probe it.

        One probe at a time (the breaker's lock, taken in turn), each no sooner than the
        breaker's ``next_probe``. True when the endpoint works again (a probe, ours or an
        earlier one, succeeded): the call goes on. False when our probe failed: the call
        comes round again. Raises UnavailableError once the outage outlasts --max-outage
        with no other endpoint healthy.
        """
        outage = replica.outage
        async with outage.lock:
            # A fault answered meanwhile (a Retry-After) may push the probe on: wait it too.
            while outage.open and outage.wait_s() > 0:
                await anyio.sleep(outage.wait_s())
            if not outage.open:
                return True
            sent_at = self._clock()
            failed = await self._ping(replica)
            if failed is None and outage.close(sent_at):
                return True
            wait = failed.wait if failed else None
            delay = self.delays.probe_after(outage.probes, self._rng.random(), wait)
            outage.probe_failed(sent_at, delay)
            if outage.exceeded(self.succeeded > 0) and not self.replicas.healthy():
                last = failed.failure if failed else CallError("unavailable", "probe overtaken")
                raise outage.unavailable(last) from last
            return False

    async def _ping(self, replica: Replica[C]) -> Failed | None:
        """Send the probe: None when the endpoint answered anything but an endpoint fault."""
        sent, payload = self._probe_body()
        replica.in_flight += 1
        self.probes += 1
        try:
            await self._attempt(replica, sent, payload, 1)
        except Failed as failed:
            if isinstance(failed.failure, FatalCallError):
                raise failed.failure from failed
            # Any answer but an endpoint fault proves the server works: a refusal of the
            # probe (a 400), an empty answer, even a 200 whose body is no answer at all.
            if endpoint_fault(failed.failure) and failed.failure.category != "bad_response":
                return failed
        finally:
            replica.in_flight -= 1
        return None

    def _completion(
        self,
        replied: dict[str, Any],
        sent: list[dict[str, str]],
        started: float,
        attempts: int,
        tries: tuple[Try, ...],
    ) -> Completion:
        usage = replied["usage"]
        return Completion(
            text=replied["text"],
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            cached_tokens=usage["cached_tokens"],
            cache_write_tokens=usage.get("cache_write_tokens", 0),
            cache_write_1h_tokens=usage.get("cache_write_1h_tokens", 0),
            latency_s=round(self._clock() - started, 4),
            attempts=attempts,
            finish_reason=replied["finish_reason"],
            messages=sent,
            model=self._model,
            tries=tries,
            service_tier=replied["service_tier"],
        )

    async def _attempt(
        self, replica: Replica[C], sent: list[dict[str, str]], payload: bytes, max_tokens: int
    ) -> dict[str, Any]:
        """One HTTP request: the read answer, or Failed."""
        estimate = estimate_tokens(sent)
        reservation: Reservation | None = None
        if self.budget is not None:
            batch = at_batch_rate(None, self.service_tier)  # flex bills the batch rate
            reservation = await self.budget.reserve(self._model, estimate, max_tokens, batch=batch)
        usage: Mapping[str, int] | None = None
        try:
            booking = await self.limiter.acquire(estimate, max_tokens)
            self.calls += 1
            try:
                # The whole attempt, the answer's last byte included: an SDK's or a
                # transport's own timeout spans only each read, which a server trickling
                # bytes never trips.
                with anyio.fail_after(self.timeout):
                    reply = await self._send(replica, payload)
            except TimeoutError as err:
                failure = CallError("timeout", f"no answer within {self.timeout:g} s")
                raise Failed(failure) from err
            self.limiter.observe(reply.headers)
            replied = self._parse(reply.content)
            usage = replied["usage"]
            if reservation is not None:  # settled at the rate of the tier that served it
                batch = at_batch_rate(None, replied["service_tier"])
                reservation = replace(reservation, batch=batch)
            self.limiter.settle(booking, self._counted(usage), usage["completion_tokens"])
            self.succeeded += 1
            return replied
        finally:
            if self.budget is not None:
                self.budget.settle(reservation, usage)

    def _parse(self, body: bytes) -> dict[str, Any]:
        """The answer's text, finish reason and usage; Failed when the body is not an answer."""
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as err:
            failure = CallError("bad_response", f"malformed response body ({len(body)} bytes)")
            raise Failed(failure) from err
        try:
            return self._read_reply(data)
        except CallError as failure:
            raise Failed(failure) from failure

    def _status(self, error: Status) -> Failed:
        """The failure an error status means (the retry policy decides what follows)."""
        status, headers = error.status, error.headers
        self.limiter.observe(headers)
        message = redact(error.message, self._secret)
        wait = retry_after(headers)
        no_capacity = flex_refused(status, error.code)  # the flex tier's: neither limit nor quota
        if status == 429 and not no_capacity:
            self.limiter.on_rate_limited(wait)
        text = f"HTTP {status}: {message}"
        if self._quota_spent(status, error.code, message, wait) and not no_capacity:
            failure: CallError = UnavailableError(
                "quota",
                f"the API key's quota or billing limit is spent ({text}): raise it or add "
                "credit, then run the same command again; resumable",
                status=status,
            )
            return Failed(failure)
        kind = classify_status(status)
        if kind == "auth":
            return Failed(AuthError("auth", text, status=status))
        if status == 404 and ("model" in message.lower() or self.succeeded == 0):
            failure = FatalCallError(
                "not_found", f"{text} (check --model and --base-url)", status=status
            )
            return Failed(failure)
        return Failed(
            CallError(f"http_{status}", text, status=status), wait, error.code, error.param
        )
