"""The model client: one OpenAI-compatible chat call with pacing, retries and timeouts.

This is the only retry layer. The openai SDK retries by itself, so it is built
with ``max_retries=0``: our retries share the run's rate limiter (a retried
request is paced like any other), honour ``Retry-After`` per request, and stop
the whole run on errors every record would hit (401/403, unknown model).

Structured feedback degrades in the order endpoints support it: OpenAI's
``json_schema``; llama.cpp's ``json_object`` with a ``schema``; plain text with
the schema in the prompt. The first refusal of a level moves every later call
of the run down to the next one.
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import httpx2
import openai
import orjson

from .errors import AuthError, CallError, FatalCallError, UnavailableError
from .limits import Limiter, estimate_tokens
from .loop import Completion

__all__ = ["LEVELS", "OpenAIClient", "backoff_delay", "classify_status", "redact", "retry_after"]

LEVELS = ("json_schema", "json_object", "text")
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
# A server's Retry-After longer than this is treated as an outage window to
# wait out with our own backoff rather than trusted blindly.
RETRY_AFTER_CAP_S = 120.0
RETRYABLE_STATUS = frozenset({408, 409, 429})
# Consecutive server faults (5xx, timeouts, broken connections) with no success
# between them, pool-wide, that make an outage; probe spacing while in one; how
# long an outage is waited out (much less for an endpoint that never answered).
OUTAGE_AFTER = 8
OUTAGE_PROBE_CAP_S = 5.0
MAX_OUTAGE_S = 300.0
FIRST_CONTACT_S = 30.0
_DEGRADE_HINTS = ("response_format", "json", "schema", "grammar")
# Calls that had to go one structured level down after a 400 naming nothing before
# the whole pool goes down too.
FORMAT_VOTES = 3


def backoff_delay(
    attempt: int, rand: float, *, base: float = BACKOFF_BASE_S, cap: float = BACKOFF_CAP_S
) -> float:
    """Exponential backoff with jitter for retry ``attempt`` (1-based): half fixed, half random.

    Clamped before exponentiation so huge attempt numbers cannot overflow.
    """
    exp = min(max(attempt - 1, 0), 32)
    ceiling = min(cap, base * (2.0**exp))
    return ceiling * (0.5 + 0.5 * min(max(rand, 0.0), 1.0))


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the server asks us to wait (``retry-after-ms``, ``retry-after`` seconds or date)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def classify_status(status: int) -> str:
    """What a failed status means: ``retry``, ``auth`` (stop the run) or ``record`` (fail it)."""
    if status in RETRYABLE_STATUS or status >= 500:
        return "retry"
    if status in (401, 403):
        return "auth"
    return "record"


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` masked."""
    if secret and len(secret) >= 4:
        return text.replace(secret, "***")
    return text


def _schema_instruction(schema: Mapping[str, Any]) -> str:
    return (
        "\n\nAnswer with a single JSON object and nothing else. It must match this JSON Schema:\n"
        "```json\n" + orjson.dumps(schema, option=orjson.OPT_INDENT_2).decode() + "\n```"
    )


def _strict_ok(schema: Mapping[str, Any]) -> bool:
    props = schema.get("properties", {})
    return schema.get("additionalProperties") is False and set(schema.get("required", [])) == set(
        props
    )


class OpenAIClient:
    """An OpenAI-compatible chat endpoint behind the run's limiter and retry policy."""

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None,
        api_key: str | None,
        timeout: float,
        max_retries: int,
        limiter: Limiter,
        concurrency: int = 64,
        structured: str = "json_schema",
        max_in_flight: int | None = None,
        backoff_base: float = BACKOFF_BASE_S,
        max_outage: float = MAX_OUTAGE_S,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.timeout = timeout
        self.max_retries = max_retries
        self.limiter = limiter
        self.level = LEVELS.index(structured)
        self.backoff_base = backoff_base
        self.calls = 0
        self.retries = 0
        self.succeeded = 0
        self._secret = api_key
        self._rng = rng or random.Random()
        self._clock = clock
        self._slots = anyio.Semaphore(max_in_flight) if max_in_flight else None
        self._format_votes = 0
        self.outage = Outage(
            max_outage, FIRST_CONTACT_S, clock, threshold=min(OUTAGE_AFTER, max_retries + 1)
        )
        connections = max(concurrency, 16) + 16
        self._http = _http_client(
            httpx2.Limits(max_connections=connections, max_keepalive_connections=connections)
        )
        self._sdk = openai.AsyncOpenAI(
            api_key=api_key or "no-key",
            base_url=base_url,
            max_retries=0,  # this class is the one retry layer (see module docstring)
            timeout=timeout,
            http_client=self._http,
        )

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._sdk.close()

    def _request(
        self,
        messages: Sequence[Mapping[str, str]],
        schema: Mapping[str, Any] | None,
        level: int,
        temperature: float,
        max_tokens: int,
    ) -> tuple[list[dict[str, str]], dict[str, Any]]:
        sent = [dict(m) for m in messages]
        extra: dict[str, Any] = {}
        if schema is not None:
            if LEVELS[level] == "json_schema":
                extra["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "feedback",
                        "schema": dict(schema),
                        "strict": _strict_ok(schema),
                    },
                }
            elif LEVELS[level] == "json_object":
                extra["response_format"] = {"type": "json_object", "schema": dict(schema)}
            # json_object needs the word JSON in the prompt on some servers, and plain
            # text needs the schema spelled out: both get the instruction.
            if LEVELS[level] != "json_schema":
                sent[-1]["content"] = sent[-1]["content"] + _schema_instruction(schema)
        return sent, {"temperature": temperature, "max_tokens": max_tokens, **extra}

    async def complete(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        schema: Mapping[str, Any] | None,
        temperature: float,
        max_tokens: int,
    ) -> Completion:
        """One chat completion, retried as the policy allows; raises CallError when it gives up."""
        if self._slots is None:
            return await self._complete(messages, schema, temperature, max_tokens)
        async with self._slots:
            return await self._complete(messages, schema, temperature, max_tokens)

    async def _complete(
        self,
        messages: Sequence[Mapping[str, str]],
        schema: Mapping[str, Any] | None,
        temperature: float,
        max_tokens: int,
    ) -> Completion:
        attempt = 0
        floor = 0  # this call's own structured level, when a 400 hinted at the format
        started = self._clock()
        while True:
            attempt += 1
            # While the server is down, one request at a time probes it, so the pool
            # neither hammers a dead endpoint nor burns every call's retries on it.
            probing = self.outage.open
            if probing:
                await self.outage.lock.acquire()
                if not self.outage.open:  # it came back while we queued
                    self.outage.lock.release()
                    probing = False
            try:
                sent_at = self._clock()
                try:
                    result = await self._attempt(
                        messages, schema, temperature, max_tokens, attempt, started, floor
                    )
                except _Retry as retry:
                    failure, wait = retry.failure, retry.wait
                else:
                    self.outage.close(sent_at)
                    if floor > self.level:
                        # A bare 400 went away one level down: after a few such calls the
                        # whole pool starts there.
                        self._format_votes += 1
                        if self._format_votes >= FORMAT_VOTES:
                            self.level = max(self.level, floor)
                    return result
                if failure.kind == "format":
                    attempt -= 1  # a format probe is not a failed attempt
                    continue
                if failure.kind == "format_guess":
                    floor = max(floor, self.level) + 1
                    attempt -= 1
                    continue
                self.retries += 1
                if _server_fault(failure) and self.outage.failed():
                    if self.outage.exceeded(self.succeeded > 0):
                        raise UnavailableError(
                            "unavailable",
                            f"the endpoint has been failing for {self.outage.duration():.0f} s "
                            f"(last: {failure}); stopped, resumable",
                            status=failure.status,
                            attempts=attempt,
                        ) from None
                    attempt -= 1  # waiting out an outage does not use up this call's retries
                    delay = min(
                        OUTAGE_PROBE_CAP_S,
                        backoff_delay(
                            self.outage.failures - self.outage.threshold + 1, self._rng.random()
                        ),
                    )
                elif attempt > self.max_retries:
                    raise failure
                else:
                    delay = backoff_delay(attempt, self._rng.random(), base=self.backoff_base)
                    if wait is not None:
                        # A 429's Retry-After is the server's exact answer; other statuses
                        # keep at least our own backoff so a flapping server is not hammered.
                        delay = max(
                            min(wait, RETRY_AFTER_CAP_S), 0.0 if failure.status == 429 else delay
                        )
                await anyio.sleep(delay)
            finally:
                if probing:
                    self.outage.lock.release()

    async def _attempt(
        self,
        messages: Sequence[Mapping[str, str]],
        schema: Mapping[str, Any] | None,
        temperature: float,
        max_tokens: int,
        attempt: int,
        started: float,
        floor: int = 0,
    ) -> Completion:
        """One HTTP request: its Completion, or _Retry, or a CallError that ends the call."""
        level = max(self.level, floor)
        sent, params = self._request(messages, schema, level, temperature, max_tokens)
        booking = await self.limiter.acquire(estimate_tokens(sent), max_tokens)
        self.calls += 1
        try:
            with anyio.fail_after(self.timeout + 5.0):
                # A plain POST of bytes we encode: the SDK's typed resource method
                # transforms every message dict and json-encodes with the standard
                # library, which costs more CPU per call than the rest of the pipeline.
                # Auth, base URL and the mapping of error statuses to exceptions stay
                # the SDK's.
                raw = await self._sdk.post(
                    "/chat/completions",
                    cast_to=httpx2.Response,
                    content=orjson.dumps({"model": self.model, "messages": sent, **params}),
                    options={"headers": {"Content-Type": "application/json"}},
                )
                body = raw.content
            self.limiter.observe(raw.headers)
            result = self._parse(body, sent, attempt, self._clock() - started)
            self.limiter.settle(booking, result.prompt_tokens)
            self.succeeded += 1
            return result
        except openai.APIStatusError as err:
            status = err.status_code
            headers = err.response.headers
            self.limiter.observe(headers)
            message = redact(_error_message(err), self._secret)
            wait = None
            if status == 429:
                wait = retry_after(headers)
                self.limiter.on_rate_limited(wait)
            if schema is not None and level < len(LEVELS) - 1:
                if _format_refused(status, message):
                    self.level = max(self.level, level + 1)
                    raise _Retry(CallError("format", message, status=status)) from None
                if status in (400, 422):
                    # A 400 that names nothing: maybe our response_format, maybe the
                    # request. Try this call one level down before blaming the record.
                    raise _Retry(CallError("format_guess", message, status=status)) from None
            kind = classify_status(status)
            text = f"HTTP {status}: {message}"
            if kind == "auth":
                raise AuthError("auth", text, status=status, attempts=attempt) from None
            if status == 404 and ("model" in message.lower() or self.succeeded == 0):
                raise FatalCallError(
                    "not_found",
                    f"{text} (check --model and --base-url)",
                    status=status,
                    attempts=attempt,
                ) from None
            failure = CallError(f"http_{status}", text, status=status, attempts=attempt)
            if kind == "record":
                raise failure from None
            raise _Retry(failure, wait) from None
        except (TimeoutError, openai.APITimeoutError):
            raise _Retry(
                CallError("timeout", f"no answer within {self.timeout:g} s", attempts=attempt)
            ) from None
        except openai.APIConnectionError as err:
            message = redact(f"connection failed: {err.__cause__ or err}", self._secret)
            raise _Retry(CallError("connection", message, attempts=attempt)) from None
        except _RetryableAnswer as err:
            raise _Retry(CallError(err.kind, str(err), attempts=attempt)) from None
        except httpx2.HTTPError as err:  # a body cut short while reading it
            message = f"response broken off: {type(err).__name__}"
            raise _Retry(CallError("connection", message, attempts=attempt)) from None

    def _parse(
        self, body: bytes, sent: list[dict[str, str]], attempts: int, elapsed: float
    ) -> Completion:
        try:
            data = orjson.loads(body)
            choice = data["choices"][0]
            message = choice["message"]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as err:
            raise _RetryableAnswer(
                "bad_response", f"malformed response body ({len(body)} bytes)"
            ) from err
        content = message.get("content")
        if not content:
            refusal = message.get("refusal")
            if refusal:
                raise CallError("refusal", f"model refused: {refusal}", attempts=attempts)
            raise _RetryableAnswer("empty", "empty answer")
        usage = data.get("usage") or {}
        return Completion(
            text=content,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            latency_s=round(elapsed, 4),
            attempts=attempts,
            finish_reason=choice.get("finish_reason"),
            messages=sent,
        )


def _http_client(limits: httpx2.Limits) -> httpx2.AsyncClient:
    """The SDK's aiohttp transport when installed, else its default one.

    Measured here (scripts/bench_throughput.py, zero-latency simulator) the aiohttp
    transport costs about half the CPU per call of the default httpx transport,
    which decides throughput once latency is hidden by concurrency.
    """
    try:
        return openai.DefaultAioHttpClient(limits=limits)
    except RuntimeError:  # openai installed without its aiohttp extra
        return openai.DefaultAsyncHttpx2Client(limits=limits)


class _Retry(Exception):
    """A failed attempt that the retry policy may repeat."""

    def __init__(self, failure: CallError, wait: float | None = None) -> None:
        self.failure = failure
        self.wait = wait
        super().__init__(str(failure))


def _server_fault(failure: CallError) -> bool:
    """Failures that say the server (not this request) is in trouble: outage material."""
    status = failure.status
    return failure.kind in ("timeout", "connection", "bad_response") or (
        status is not None and status >= 500
    )


class Outage:
    """A pool-wide circuit breaker for an endpoint that keeps failing.

    After ``threshold`` server faults with no success between them the circuit
    opens: requests then go one at a time (probes) with a capped backoff, and their
    failures do not use up retries, until a success closes it. The threshold is at
    most one more than a call's retries, so a call alone in a dead server's queue
    opens the circuit before it gives up. Only a request sent after the latest fault
    can close it: an answer already on its way when the server went down proves
    nothing. An outage longer than ``max_s`` (``first_s`` before any call has ever
    succeeded, which is most likely a wrong URL) stops the run; records stay pending.
    """

    __slots__ = (
        "_clock",
        "failures",
        "first_s",
        "last_fault",
        "lock",
        "max_s",
        "since",
        "threshold",
    )

    def __init__(
        self,
        max_s: float,
        first_s: float,
        clock: Callable[[], float],
        threshold: int = OUTAGE_AFTER,
    ) -> None:
        self.max_s = max_s
        self.first_s = first_s
        self.threshold = max(2, threshold)
        self._clock = clock
        self.failures = 0
        self.since: float | None = None
        self.last_fault = -math.inf
        self.lock = anyio.Lock()

    @property
    def open(self) -> bool:
        """Whether requests should currently go one at a time."""
        return self.since is not None

    def close(self, sent_at: float) -> None:
        """A success of a request sent at ``sent_at``: the endpoint works, if sent after a fault."""
        if sent_at >= self.last_fault:
            self.failures = 0
            self.since = None

    def failed(self) -> bool:
        """Count a server fault; return whether the circuit is open."""
        now = self._clock()
        self.last_fault = now
        self.failures += 1
        if self.failures >= self.threshold and self.since is None:
            self.since = now
        return self.since is not None

    def duration(self) -> float:
        """Seconds since the circuit opened (0 when closed)."""
        return 0.0 if self.since is None else self._clock() - self.since

    def exceeded(self, ever_succeeded: bool) -> bool:
        """Whether the outage has outlasted what we wait for."""
        return self.duration() > (self.max_s if ever_succeeded else min(self.max_s, self.first_s))


class _RetryableAnswer(Exception):
    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


def _format_refused(status: int, message: str) -> bool:
    """Whether an error answer says the server does not take our ``response_format``.

    Most servers answer 400 or 422; llama-cpp-python's server answers 500 with a
    validation error naming ``response_format``.
    """
    text = message.lower()
    if status in (400, 422):
        return any(h in text for h in _DEGRADE_HINTS)
    return status == 500 and "response_format" in text


def _error_message(err: openai.APIStatusError) -> str:
    body = err.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return err.message
