"""The model client: one OpenAI-compatible chat call, paced, paid for, retried, timed out.

The openai SDK is built with ``max_retries=0``: the one retry layer is the call's retry
sequence (``attempts.Attempts``), which after each failed attempt says whether to step
down the format ladder, retry, fail the record or stop the run; this client does what it
says and waits its delays. Before asking it, the endpoint's own refusals are handled
here: a prompt cache key it does not take, the flex tier's lack of capacity, a URL that
never answered. Every attempt is paced by the run's limiter, reserved against its budget
first, and cut off at ``timeout`` seconds, the whole answer included. While an endpoint
is in an outage its calls wait for one-at-a-time probes (``_probe``). The pieces it
composes each live in a module of their own: ``attempts`` (the retry sequence), ``retry``
(its policy), ``delays`` (every wait), ``outage`` (the breaker per replica), ``formats``
(how feedback JSON is asked for), ``replicas`` (several URLs of one model), ``limits`` (pacing),
``budget`` (the spending cap), ``caching`` (the prompt cache key), ``flex`` (service
tiers; flex refusals waited out as capacity), ``replies`` (reading what the endpoint
replied).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import anyio
import httpx2
import openai
import orjson

from ..core.steps import Completion, Request, Try
from ..errors import AuthError, CallError, FatalCallError, UnavailableError
from .attempts import Attempts, FailRecord, HaltRun, Retry
from .budget import Reservation, Spending
from .caching import CACHE_KEY_PARAM, cache_key_refused, cache_options
from .context import overflow
from .delays import DELAYS, Delays
from .flex import FLEX, Capacity, flex_refused, tier_options
from .formats import FormatLadder
from .limits import RateLimiter, estimate_tokens
from .outage import (
    FIRST_CONTACT_S,
    MAX_OUTAGE_S,
    OUTAGE_AFTER,
    PROBE_MAX_TOKENS,
    PROBE_MESSAGES,
    Outage,
)
from .prices import at_batch_rate
from .reach import PREFLIGHT_S, base_url, os_error, preflight, unreachable, unreachable_error
from .replicas import Replica, Replicas
from .replies import error_message, http_client, read_reply, redact
from .retry import (
    OutageState,
    classify_status,
    endpoint_fault,
    error_fields,
    quota_spent,
    retry_after,
)

__all__ = ["OpenAIClient"]


class _Failed(Exception):
    """One failed attempt: the failure, the server's Retry-After, and the error's code and
    param (OpenAI's envelope) when it sent them."""

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


class OpenAIClient:
    """An OpenAI-compatible chat endpoint (or several replicas) behind the run's policies."""

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
        self.service_tier = service_tier  # sent as ``service_tier`` on every call when set
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
        connections = max(concurrency, 16) + 16
        limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=connections)
        threshold = min(OUTAGE_AFTER, max_retries + 1)
        self.replicas: Replicas[openai.AsyncOpenAI] = Replicas(
            [
                Replica(
                    url,
                    openai.AsyncOpenAI(
                        api_key=api_key or "no-key",
                        base_url=url,
                        max_retries=0,  # the one retry layer is attempts.Attempts
                        timeout=timeout,
                        http_client=http_client(limits),
                    ),
                    Outage(max_outage, FIRST_CONTACT_S, clock, threshold=threshold),
                )
                for url in urls
            ],
            clock,
        )

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
        """The breaker of the first replica (the only one, in most runs)."""
        return self.replicas.all[0].outage

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        for replica in self.replicas.all:
            await replica.conn.close()

    async def preflight(self) -> None:
        """Raise UnreachableError for an endpoint that cannot be reached (``reach.preflight``)."""
        wait = min(self.timeout or PREFLIGHT_S, PREFLIGHT_S)
        await preflight((e.conn for e in self.replicas.all), wait)

    async def complete(self, request: Request) -> Completion:
        """One chat completion, retried as the policy allows.

        Raises CallError when the call fails for good (a prompt that cannot fit the context
        window fails unsent), a FatalCallError subclass when the run must stop, and
        BudgetReached when the next attempt cannot be paid for. The request's cache key
        goes as ``prompt_cache_key`` (where the endpoint takes it).
        """
        if self.context_tokens is not None:
            too_long = overflow(request.messages, self.context_tokens, self._model)
            if too_long is not None:
                raise too_long
        if self._slots is None:
            return await self._complete(request)
        async with self._slots:
            return await self._complete(request)

    def _sampling(self, request: Request) -> dict[str, Any]:
        """The request-body fields every attempt of ``request`` sends, the format's aside."""
        body: dict[str, Any] = {
            "temperature": request.temperature,
            "max_tokens": request.max_tokens,
            **tier_options(self.service_tier),
        }
        if request.frequency_penalty is not None:
            body["frequency_penalty"] = request.frequency_penalty
        return body

    async def _complete(self, request: Request) -> Completion:
        schema, cache_key = request.schema, request.cache_key
        sampling = self._sampling(request)
        attempts = Attempts(self._model, self.max_retries, self.delays)
        ladder = self.formats if schema is not None else None
        refused = 0  # flex refusals waited out (they use up no retry)
        started = self._clock()
        while True:
            replica = self.replicas.pick()
            if replica.outage.open and not await self._probe(replica):
                continue  # still down: wait for the next probe (or another replica)
            level = attempts.level(self.formats)
            sent, extra = self.formats.request(request.messages, schema, level)
            body = {**sampling, **cache_options(cache_key, replica.takes_cache_key), **extra}
            replica.in_flight += 1
            sent_at = self._clock()
            try:
                reply = await self._attempt(replica, sent, body, request.max_tokens)
            except _Failed as failed:
                error = failed
            else:
                replica.outage.close(sent_at)
                self.capacity.succeeded()
                self.formats.succeeded(level)
                tries = attempts.succeeded(round(self._clock() - sent_at, 4))
                return self._completion(reply, sent, started, len(attempts.tries), tries)
            finally:
                replica.in_flight -= 1
            failure = error.failure
            attempts.failed(failure, round(self._clock() - sent_at, 4))
            # The endpoint's own refusals first: they are about it, not about the call.
            sent_key = CACHE_KEY_PARAM in body  # (a refusal once the key is dropped fails)
            if sent_key and cache_key_refused(failure.status, str(failure), error.param):
                replica.takes_cache_key = False  # unknown to this server: go again without
                continue
            if self.service_tier == FLEX and flex_refused(failure.status, error.code):
                refused += 1
                await self._wait_capacity(failure, refused, attempts, sent)
                continue
            if error.unreachable is not None and self.succeeded == 0:  # a wrong URL: stop
                stop = unreachable_error(base_url(replica.conn), error.unreachable)
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
        self,
        replica: Replica[openai.AsyncOpenAI],
        sent_at: float,
        wait: float | None,
        failure: CallError,
    ) -> OutageState:
        """Count an endpoint fault on the replica's breaker; the state the policy sees."""
        outage = replica.outage
        if endpoint_fault(failure):
            outage.failed(sent_at, self.delays.probe_after(outage.probes, self._rng.random(), wait))
        state = outage.state(self.succeeded > 0)
        if state.exceeded and self.replicas.healthy():  # the others carry the run
            return OutageState(open=True)
        return state

    async def _probe(self, replica: Replica[openai.AsyncOpenAI]) -> bool:
        """Wait for this call's turn to probe a replica in an outage, then probe it.

        One probe at a time (the breaker's lock, taken in turn), each no sooner than the
        breaker's ``next_probe``. True when the replica works again (a probe, ours or an
        earlier one, succeeded): the call goes on. False when our probe failed: the call
        comes round again. Raises UnavailableError once the outage outlasts --max-outage
        with no other replica healthy.
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

    async def _ping(self, replica: Replica[openai.AsyncOpenAI]) -> _Failed | None:
        """Send the probe: None when the endpoint answered anything but an endpoint fault."""
        sent = [dict(m) for m in PROBE_MESSAGES]
        body = {"temperature": 0, "max_tokens": PROBE_MAX_TOKENS}
        replica.in_flight += 1
        self.probes += 1
        try:
            await self._attempt(replica, sent, body, PROBE_MAX_TOKENS)
        except _Failed as failed:
            if isinstance(failed.failure, FatalCallError):
                raise failed.failure from failed
            # Any answer but an endpoint fault proves the server works: a refusal of the
            # probe (a 400), an empty answer, even a 200 whose body is no chat completion.
            if endpoint_fault(failed.failure) and failed.failure.category != "bad_response":
                return failed
        finally:
            replica.in_flight -= 1
        return None

    def _completion(
        self,
        reply: dict[str, Any],
        sent: list[dict[str, str]],
        started: float,
        attempts: int,
        tries: tuple[Try, ...],
    ) -> Completion:
        usage = reply["usage"]
        return Completion(
            text=reply["text"],
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            cached_tokens=usage["cached_tokens"],
            latency_s=round(self._clock() - started, 4),
            attempts=attempts,
            finish_reason=reply["finish_reason"],
            messages=sent,
            model=self._model,
            tries=tries,
            service_tier=reply["service_tier"],
        )

    async def _attempt(
        self,
        replica: Replica[openai.AsyncOpenAI],
        sent: list[dict[str, str]],
        body: dict[str, Any],
        max_tokens: int,
    ) -> dict[str, Any]:
        """One HTTP request: the parsed reply, or _Failed."""
        estimate = estimate_tokens(sent)
        reservation: Reservation | None = None
        if self.budget is not None:
            batch = at_batch_rate(None, self.service_tier)  # flex bills the batch rate
            reservation = await self.budget.reserve(self._model, estimate, max_tokens, batch=batch)
        usage: Mapping[str, int] | None = None
        try:
            booking = await self.limiter.acquire(estimate, max_tokens)
            self.calls += 1
            raw = await self._post(replica, sent, body)
            self.limiter.observe(raw.headers)
            reply = _parse(raw.content)
            usage = reply["usage"]
            if reservation is not None:  # settled at the rate of the tier that served it
                batch = at_batch_rate(None, reply["service_tier"])
                reservation = replace(reservation, batch=batch)
            self.limiter.settle(booking, usage["prompt_tokens"])
            self.succeeded += 1
            return reply
        finally:
            if self.budget is not None:
                self.budget.settle(reservation, usage)

    async def _post(
        self,
        replica: Replica[openai.AsyncOpenAI],
        sent: list[dict[str, str]],
        body: dict[str, Any],
    ) -> httpx2.Response:
        """POST the request; translate every failure into _Failed or a final CallError."""
        try:
            # The whole attempt, the answer's last byte included: the SDK's own timeout
            # spans only each read, which a server trickling bytes never trips.
            with anyio.fail_after(self.timeout):
                # A plain POST of bytes we encode: the SDK's typed resource method
                # transforms every message dict and json-encodes with the standard
                # library, which costs more CPU per call than the rest of the pipeline.
                # Auth, base URL and the mapping of error statuses to exceptions stay
                # the SDK's.
                raw = await replica.conn.post(
                    "/chat/completions",
                    cast_to=httpx2.Response,
                    content=orjson.dumps({"model": self._request_model, "messages": sent, **body}),
                    options={"headers": {"Content-Type": "application/json"}},
                )
                await raw.aread()
                return raw
        except openai.APIStatusError as err:
            raise self._status_failure(err) from err
        except openai.APIConnectionError as err:  # timeouts too: a refused connect may be one
            why = unreachable(err)
            if why is not None:
                failure = CallError("connection", f"cannot reach {base_url(replica.conn)}: {why}")
                raise _Failed(failure, unreachable=why) from err
            broke = os_error(err)
            if broke is None and isinstance(err, openai.APITimeoutError):
                failure = CallError("timeout", f"no answer within {self.timeout:g} s")
                raise _Failed(failure) from err
            message = redact(f"connection failed: {broke or err.__cause__ or err}", self._secret)
            raise _Failed(CallError("connection", message)) from err
        except TimeoutError as err:
            failure = CallError("timeout", f"no answer within {self.timeout:g} s")
            raise _Failed(failure) from err
        except httpx2.HTTPError as err:  # a body cut short while reading it
            message = f"response broken off: {type(err).__name__}"
            raise _Failed(CallError("connection", message)) from err

    def _status_failure(self, err: openai.APIStatusError) -> _Failed:
        """The failure an error status means (the retry policy decides what follows)."""
        status = err.status_code
        headers = err.response.headers
        self.limiter.observe(headers)
        message = redact(error_message(err), self._secret)
        code, param = error_fields(err.body)
        wait = retry_after(headers)
        no_capacity = flex_refused(status, code)  # the flex tier's: neither limit nor quota
        if status == 429 and not no_capacity:
            self.limiter.on_rate_limited(wait)
        text = f"HTTP {status}: {message}"
        if quota_spent(status, code, message, wait) and not no_capacity:
            failure: CallError = UnavailableError(
                "quota",
                f"the API key's quota or billing limit is spent ({text}): raise it or add "
                "credit, then run the same command again; resumable",
                status=status,
            )
            return _Failed(failure)
        meaning = classify_status(status)
        if meaning == "auth":
            return _Failed(AuthError("auth", text, status=status))
        if status == 404 and ("model" in message.lower() or self.succeeded == 0):
            failure = FatalCallError(
                "not_found", f"{text} (check --model and --base-url)", status=status
            )
            return _Failed(failure)
        return _Failed(CallError(f"http_{status}", text, status=status), wait, code, param)


def _parse(body: bytes) -> dict[str, Any]:
    """The reply's text, finish reason and usage; _Failed when the body is no chat completion."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        failure = CallError("bad_response", f"malformed response body ({len(body)} bytes)")
        raise _Failed(failure) from err
    try:
        return read_reply(data)
    except CallError as failure:
        raise _Failed(failure) from failure
