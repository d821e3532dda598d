"""``POST /v1/messages``, answered in steps: headers → validate → cache → rate-limit →
fault → answer; and the same answer for a Message Batches line.

The answer is the OpenAI dialect's (``content.write_answer``) for the same conversation
(the system prompt first, then each turn's text), so both dialects answer one conversation
alike. It comes back as a ``text`` block, as JSON valid against ``output_config.format``'s
schema, or, when ``tool_choice`` forces a tool, as one ``tool_use`` block whose ``input``
is valid against the tool's ``input_schema`` (``stop_reason`` "tool_use"). ``stop_reason``
is "max_tokens" when the answer is cut at ``max_tokens`` (a cut ``tool_use`` keeps an empty
``input``; ``max_tokens`` 0 answers nothing and only fills the cache), "stop_sequence" at
the first of ``stop_sequences`` found, "refusal" for a refused answer (``p_refusal``),
else "end_turn".
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Final

import orjson

from ..batch_input import LineFate
from ..config import MESSAGES_FAULTS, SimConfig
from ..content import estimate_tokens, write_answer
from ..faults import ErrorReply
from ..log import RequestLog, RequestLogger
from ..replies import Action, Reply
from ..tiers import Bill
from .caching import BreakpointCache, CacheUse, prefix_of
from .errors import error_body, header_error, new_id
from .faults import (
    context_refusal,
    drawn_fault,
    outage_refusal,
    poison_refusal,
    quota_refusal,
    throttle_refusal,
)
from .limits import MessagesLimiter
from .prices import Usage, charge, min_cache_tokens
from .request import Invalid, MessagesRequest, parse_messages

__all__ = ["MessagesEngine"]

_TRUNCATE: Final = MESSAGES_FAULTS.index("p_truncate")
_LENGTH: Final = MESSAGES_FAULTS.index("p_length")
_REFUSAL: Final = MESSAGES_FAULTS.index("p_refusal")


@dataclass(frozen=True, slots=True)
class _MessageCall:
    """A request on its way through the steps: what its reply and log entry need."""

    t: float
    body: dict[str, Any]
    headers: dict[str, str]
    model: str | None
    request_id: str

    def reply(
        self,
        status: int,
        payload: bytes,
        outcome: str,
        headers: list[tuple[str, str]],
        *,
        action: Action = "send",
        usage: tuple[int, int] = (0, 0),
        delay: float = 0.0,
        hang_s: float = 0.0,
    ) -> Reply:
        sent = status if action in ("send", "truncate") else 0
        log = RequestLog(
            self.t,
            self.body,
            sent,
            outcome,
            outcome == "ok",
            self.headers,
            self.model,
            *usage,
            provider="anthropic",
        )
        headers = [("request-id", self.request_id), *headers]
        return Reply(status, payload, headers, action, delay, hang_s, log)


def _refusal_reply(call: _MessageCall, refusal: ErrorReply, limits: list[tuple[str, str]]) -> Reply:
    headers = [*limits, *refusal.headers]
    return call.reply(refusal.status, refusal.body, refusal.outcome, headers)


class MessagesEngine:
    """Answers messages and logs each one; owns the cache, the limits and the fault draws."""

    def __init__(self, logger: RequestLogger, bill: Bill, wall0: float) -> None:
        """``wall0`` is the Unix time at clock zero (rate-limit resets are dated)."""
        self.logger = logger
        self.bill = bill
        self.t0 = 0.0
        self.wall0 = wall0
        self.cache = BreakpointCache()
        self.limiter = MessagesLimiter(wall0)
        self._applied: SimConfig | None = None
        self._fault_rng = random.Random(0)
        self._jitter_rng = random.Random(0)
        self._answered = 0  # full answers given, against ``quota_requests``

    def open(self, now: float) -> None:
        """Start the clock; the first request sets up limits and draws afresh."""
        self.t0 = now
        self._applied = None
        self.limiter = MessagesLimiter(self.wall0)
        self._answered = 0

    def _apply(self, cfg: SimConfig, now: float) -> None:
        prev = self._applied
        if cfg is prev:
            return
        self.limiter.configure(now, cfg.rpm, cfg.itpm, cfg.otpm)
        if prev is None or prev.faults_seed != cfg.faults_seed:
            self._fault_rng = random.Random(f"messages-faults:{cfg.faults_seed}")
        if prev is None or prev.seed != cfg.seed:
            self._jitter_rng = random.Random(f"messages-jitter:{cfg.seed}")
        self._applied = cfg

    # -- real time -------------------------------------------------------------------------

    def create(self, cfg: SimConfig, headers: dict[str, str], raw: bytes, now: float) -> Reply:
        """``POST /v1/messages``."""
        self._apply(cfg, now)
        parsed = _decoded(raw)
        call = _call(headers, parsed, now - self.t0)
        refused = header_error(cfg, headers, call.request_id)
        if refused is not None:
            return call.reply(refused.status, refused.body, "auth", [])
        request = parse_messages(cfg, parsed)
        limits = self.limiter.headers(now)
        if isinstance(request, Invalid):
            body = error_body(request.status, request.message, call.request_id)
            return call.reply(request.status, body, "bad_request", limits)
        prompt = prefix_of(request)
        refusal = (
            outage_refusal(cfg, call.t, call.request_id)
            or throttle_refusal(cfg, call.t, call.request_id)
            or quota_refusal(cfg, self._answered, call.request_id)
            or context_refusal(cfg, prompt.total, request.max_tokens, call.request_id)
        )
        if refusal is not None:
            return _refusal_reply(call, refusal, limits)
        use = self.cache.plan(
            prompt, request.breakpoints, min_cache_tokens(cfg, request.model), now
        )
        admission = self.limiter.admit(now, use.uncached + use.written, request.max_tokens)
        if admission.refusal is not None:
            retry = ("retry-after", str(max(1, math.ceil(admission.wait_s))))
            body = error_body(429, admission.refusal, call.request_id)
            return call.reply(429, body, "rate_limited", [*self.limiter.headers(now), retry])
        # Every number is drawn, in a fixed order, so runs are reproducible.
        draws = [self._fault_rng.random() for _ in MESSAGES_FAULTS]
        delay = cfg.latency_s
        if cfg.jitter_s > 0:
            delay += self._jitter_rng.uniform(-cfg.jitter_s, cfg.jitter_s)
        delay = max(0.0, delay)
        fault = poison_refusal(cfg, request.texts, call.request_id) or drawn_fault(
            cfg, draws, call.request_id
        )
        if fault is not None:
            self.limiter.settle(now, request.max_tokens)  # nothing was generated
            limits = self.limiter.headers(now)
            if fault.outcome == "hang":
                return call.reply(0, b"", "hang", [], action="hang", hang_s=cfg.hang_s)
            if fault.outcome == "reset":
                return call.reply(0, b"", "reset", [], action="reset", delay=delay)
            return call.reply(
                fault.status, fault.body, fault.outcome, [*limits, *fault.headers], delay=delay
            )
        self._answered += 1
        cut, refuse = draws[_LENGTH] < cfg.p_length, draws[_REFUSAL] < cfg.p_refusal
        value, outcome, usage = self.answer(cfg, request, use, cut=cut, refuse=refuse)
        self.cache.commit(use, now)
        self.bill.add(charge(cfg, request.model, usage, batch=False))
        self.limiter.settle(now, request.max_tokens - usage.output_tokens)
        truncate = draws[_TRUNCATE] < cfg.p_truncate
        return call.reply(
            200,
            orjson.dumps(value),
            "truncated" if truncate else outcome,
            self.limiter.headers(now),
            action="truncate" if truncate else "send",
            usage=(usage.total_input, usage.output_tokens),
            delay=delay,
        )

    def count_tokens(
        self, cfg: SimConfig, headers: dict[str, str], raw: bytes, request_id: str
    ) -> Reply:
        """``POST /v1/messages/count_tokens``: the prompt's input tokens, nothing answered."""
        refused = header_error(cfg, headers, request_id)
        if refused is not None:
            return refused
        request = parse_messages(cfg, _decoded(raw), counting=True)
        if isinstance(request, Invalid):
            body = error_body(request.status, request.message, request_id)
            return Reply(request.status, body, [("request-id", request_id)])
        tokens = prefix_of(request).total
        return Reply(200, orjson.dumps({"input_tokens": tokens}), [("request-id", request_id)])

    # -- the answer ------------------------------------------------------------------------

    def answer(
        self, cfg: SimConfig, request: MessagesRequest, use: CacheUse, *, cut: bool, refuse: bool
    ) -> tuple[dict[str, Any], str, Usage]:
        """The Message object, its log outcome and its usage (``use``: the cache's split).

        ``cut`` halves the answer (stop_reason "max_tokens"); ``refuse`` refuses it.
        """
        text, _ = write_answer(
            request.conversation,
            request.texts,
            "text" if request.reply_format == "text" else "json",
            request.schema,
            seed=cfg.seed,
            p_done=cfg.p_done,
            fence_json=cfg.fence_json,
        )
        content: list[dict[str, Any]] = []
        stop, stop_sequence, outcome = "end_turn", None, "ok"
        limit = request.max_tokens
        if refuse:
            stop, outcome, text = "refusal", "refusal", ""
        elif limit == 0:
            stop, outcome, text = "max_tokens", "length", ""
        elif request.reply_format == "tool":
            complete = not cut and estimate_tokens(len(text)) <= limit
            given = orjson.loads(text) if complete else {}
            stop, outcome = ("tool_use", "ok") if complete else ("max_tokens", "length")
            text = text if complete else text[: limit * 4]
            block = {"type": "tool_use", "id": new_id("toolu_"), "name": request.tool}
            content.append({**block, "input": given})
        else:
            if cut:
                text = text[: max(1, len(text) // 2)]
                stop, outcome = "max_tokens", "length"
            found = _first_stop(text[: limit * 4], request.stop_sequences)
            if found is not None:
                text, stop_sequence = text[: found[0]], found[1]
                stop, outcome = "stop_sequence", "ok"
            elif estimate_tokens(len(text)) > limit:
                text, stop, outcome = text[: limit * 4], "max_tokens", "length"
            if text:
                content.append({"type": "text", "text": text})
        output = min(limit, estimate_tokens(len(text))) if limit else 0
        usage = Usage(use, output)
        value = {
            "id": new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": request.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": stop_sequence,
            "usage": usage.to_json("standard"),
        }
        return value, outcome, usage

    # -- batch lines -----------------------------------------------------------------------

    def answer_line(
        self,
        cfg: SimConfig,
        params: dict[str, Any],
        *,
        batch_id: str,
        custom_id: str,
        fate: LineFate,
        now: float,
    ) -> dict[str, Any]:
        """Answer and log one Message Batches request: its ``result`` object.

        It is answered as ``/v1/messages`` would, without the real-time limits and transport
        faults; its params are validated here, an invalid request ends ``errored``.
        """
        model = params.get("model") if isinstance(params.get("model"), str) else None
        request = parse_messages(cfg, params)
        usage: Usage | None = None
        failure = _line_failure(cfg, request, fate)
        if failure is not None:
            status, message, outcome = failure
            error = orjson.loads(error_body(status, message, new_id("req_")))
            result: dict[str, Any] = {"type": "errored", "error": error}
        else:
            assert isinstance(request, MessagesRequest)
            status = 200
            min_tokens = min_cache_tokens(cfg, request.model)
            use = self.cache.plan(prefix_of(request), request.breakpoints, min_tokens, now)
            value, outcome, usage = self.answer(cfg, request, use, cut=fate.cut, refuse=fate.refuse)
            value["usage"] = usage.to_json("batch")
            self.cache.commit(use, now)
            self.bill.add(charge(cfg, request.model, usage, batch=True))
            result = {"type": "succeeded", "message": value}
        tokens = (usage.total_input, usage.output_tokens) if usage is not None else (0, 0)
        self.logger.record(
            RequestLog(
                now - self.t0,
                params,
                status,
                outcome,
                outcome == "ok",
                {},
                model,
                *tokens,
                batch_id,
                custom_id,
                "anthropic",
            )
        )
        return result


def _line_failure(
    cfg: SimConfig, request: MessagesRequest | Invalid, fate: LineFate
) -> tuple[int, str, str] | None:
    """Why a batch line errors (status, message, log outcome), if it does."""
    if isinstance(request, Invalid):
        return request.status, request.message, "bad_request"
    refusal = context_refusal(cfg, prefix_of(request).total, request.max_tokens, "")
    if refusal is not None:
        return 400, str(orjson.loads(refusal.body)["error"]["message"]), refusal.outcome
    if fate.fail_status is not None:
        status = fate.fail_status
        return status, f"The request failed (simulated, status {status}).", f"error_{status}"
    return None


def _decoded(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _call(headers: dict[str, str], parsed: Any, t: float) -> _MessageCall:
    body = parsed if isinstance(parsed, dict) else {}
    model = body.get("model")
    return _MessageCall(t, body, headers, model if isinstance(model, str) else None, new_id("req_"))


def _first_stop(text: str, sequences: tuple[str, ...]) -> tuple[int, str] | None:
    """Where the first of ``sequences`` starts in ``text``, and which it is."""
    found = [(text.find(s), s) for s in sequences if s in text]
    return min(found) if found else None
