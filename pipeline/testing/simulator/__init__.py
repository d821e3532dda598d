"""An HTTP server simulating OpenAI's and Anthropic's APIs, for tests and benchmarks.

It speaks just enough HTTP/1.1 on raw ``asyncio`` protocols to be driven by the real
``openai`` client at thousands of requests per second: ``/v1/chat/completions``,
``/v1/models``, ``/v1/files`` and ``/v1/batches``; and by the real ``anthropic`` client
(base URL ``Simulator.anthropic_url``): ``/v1/messages`` with its prompt cache
(breakpoints, minimum lengths, TTL), its rate limits and errors, and Message Batches
(``/v1/messages/batches``; see ``anthropic``). Answers are deterministic functions of
the request messages and the seed; the simulator can enforce OpenAI-style rate limits,
inject faults (errors, hangs, resets, truncated bodies, outages, cut-off answers,
refusals, and those real providers send: Retry-After on 5xx, a request that always
crashes the server, context-length 400s, 429s without Retry-After, a spent quota), and
run Batch API batches in scaled time with failed lines, expiry, cancellation and
OpenAI's batch limits. It models OpenAI's prefix cache (``cached_tokens``) and the flex
tier (slower, sometimes refused with 429 ``resource_unavailable``), and keeps its own bill
(``Simulator.bill``, ``GET /v1/sim/bill``) to compare a run's reported cost with. Given an
answer key (``SimConfig.answer_key``), it is a model that knows those questions' answers and
gets them right at a set rate, one rate for first drafts and another for refinements.

Use it in-process (``with Simulator(SimConfig(...)) as sim: ... sim.url``; a ``clock`` to
advance by hand makes TTLs, outages and batches testable without sleeping) or as a separate
process: ``python -m pipeline.testing.simulator --port 0 --latency 0.05`` prints one line
``listening http://127.0.0.1:PORT/v1`` once ready and serves until SIGTERM/SIGINT.

Modules: ``config`` (SimConfig), ``content`` (the answers), ``answerkey`` (the answers of
known questions), ``engine`` (chat completions), ``chatrequest`` (validating a request),
``faults`` (the faults real providers send), ``caching`` (the prefix cache), ``tiers``
(service tiers and the bill), ``ratelimit``, ``files`` and ``batches`` (the Batch API),
``anthropic`` (Anthropic's API), ``app`` (routing), ``http`` (the HTTP/1.1 server),
``server`` (Simulator), ``log`` (RequestLog), ``cli`` (main).
"""

from .answerkey import AnswerKey
from .cli import main
from .config import SimConfig
from .log import RequestLog
from .server import Simulator
from .tiers import Bill, Charge

__all__ = ["AnswerKey", "Bill", "Charge", "RequestLog", "SimConfig", "Simulator", "main"]
