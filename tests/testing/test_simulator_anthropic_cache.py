"""The simulator's model of Anthropic's prompt cache: breakpoints, the minimum cacheable
prefix, the lookback, TTLs on the simulator's clock, and the usage and bill that follow."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.testing.simulator import SimConfig, Simulator
from pipeline.testing.simulator.anthropic.caching import prefix_of
from pipeline.testing.simulator.anthropic.request import MessagesRequest, parse_messages
from tests.anthropic_helpers import MODEL, anthropic, cached_text, client, params, raw, text
from tests.client.test_limits import FakeClock

# Model names only pick a price and a cache minimum here: a real model's retirement notice
# from the SDK is beside the point.
pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")

SYSTEM = text(1000, "system")


def user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def plain(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def usage_of(message: Any) -> tuple[int, int, int]:
    """(uncached input, cache writes, cache reads)."""
    u = message.usage
    return u.input_tokens, u.cache_creation_input_tokens, u.cache_read_input_tokens


def test_a_call_extending_the_previous_one_reads_its_prefix() -> None:
    """Self-Refine's layout: the second call repeats the first one's prompt, adds an answer
    and a request, and moves the breakpoint to its end: it reads the first call's prefix
    and writes only what it added; input + writes + reads is the whole prompt."""
    first_turn = user(cached_text(text(2000, "input")))
    with Simulator(SimConfig()) as sim, client(sim) as c:
        first = c.messages.create(model=MODEL, max_tokens=50, system=SYSTEM, messages=[first_turn])
        answer = first.content[0].text
        second = c.messages.create(
            model=MODEL,
            max_tokens=50,
            system=SYSTEM,
            messages=[
                user(plain(text(2000, "input"))),
                {"role": "assistant", "content": answer},
                user(cached_text(text(300, "feedback"))),
            ],
        )
        charges = sim.bill.charges()
    assert usage_of(first) == (0, 3000, 0)
    added = -(-(len(answer) + 1200) // 4)
    assert usage_of(second) == (0, added, 3000)
    assert [(c.cached_tokens, c.cache_write_5m_tokens) for c in charges] == [
        (0, 3000),
        (3000, added),
    ]


@pytest.mark.parametrize(
    ("model", "config", "below", "at"),
    [
        (MODEL, SimConfig(), 1023, 1024),
        ("claude-opus-4-1-20250805", SimConfig(), 1023, 1024),
        ("claude-haiku-4-5", SimConfig(), 4095, 4096),
        ("claude-opus-4-6", SimConfig(), 4095, 4096),
        ("claude-haiku-4-5", SimConfig(cache_min_tokens=100), 99, 100),
    ],
)
def test_prefixes_below_the_models_minimum_are_not_cached(
    model: str, config: SimConfig, below: int, at: int
) -> None:
    """A breakpoint on a prefix shorter than the model's minimum caches nothing (no error,
    no write, no read on a repeat); one at the minimum is written, then read."""
    with Simulator(config) as sim, client(sim) as c:

        def twice(tokens: int) -> list[tuple[int, int, int]]:
            system = [cached_text(text(tokens, f"p{tokens}"))]
            return [
                usage_of(c.messages.create(**{**params(), "model": model}, system=system))
                for _ in range(2)
            ]

        assert twice(below) == [(below + 2, 0, 0), (below + 2, 0, 0)]
        assert twice(at) == [(2, at, 0), (2, 0, at)]


def test_more_than_four_breakpoints_are_refused() -> None:
    """Five cache_control blocks, or four plus the top-level (automatic) one placed on
    another block, are a 400 naming the limit."""
    five = [cached_text(f"part {i}") for i in range(5)]
    four = [cached_text(f"part {i}") for i in range(4)]
    automatic = {"type": "ephemeral"}
    with Simulator(SimConfig()) as sim:
        refused = raw(sim, "POST", "/v1/messages", params(system=five))
        also = raw(sim, "POST", "/v1/messages", params(system=four, cache_control=automatic))
        fine = raw(sim, "POST", "/v1/messages", params(system=four))
    for status, _, body in (refused, also):
        assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert refused[2]["error"]["message"] == (
        "A maximum of 4 blocks with cache_control may be provided. Found 5."
    )
    assert fine[0] == 200


def test_entries_expire_after_their_ttl_on_the_simulators_clock() -> None:
    """A 5-minute entry is read until 300 s after its last use (each read refreshes it),
    then missed and written again; a 1-hour one lives 3,600 s."""
    clock = FakeClock()
    short = [cached_text(text(2000, "short"))]
    long = [cached_text(text(2000, "long"), "1h")]
    with Simulator(SimConfig(), clock=clock) as sim, client(sim) as c:

        def at(t: float, system: list[dict[str, Any]]) -> tuple[int, int, int]:
            clock.now = t
            return usage_of(c.messages.create(**params(), system=system))

        assert at(0.0, short) == (2, 2000, 0)
        assert at(299.9, short) == (2, 0, 2000)
        assert at(599.8, short) == (2, 0, 2000)  # the read at 299.9 refreshed it
        assert at(899.8, short) == (2, 2000, 0)
        assert at(1000.0, long) == (2, 2000, 0)
        assert at(4599.9, long) == (2, 0, 2000)
        assert at(8199.9, long) == (2, 2000, 0)


def test_a_read_found_by_looking_back_refreshes_the_entry_read() -> None:
    """An entry read from a later breakpoint's lookback lives 300 s more from that read,
    though the reading request has no breakpoint on it."""
    clock = FakeClock()
    first = [user(cached_text(text(2000, "input")))]
    longer = [
        user(plain(text(2000, "input"))),
        {"role": "assistant", "content": "an answer"},
        user(cached_text("a request")),
    ]
    with Simulator(SimConfig(), clock=clock) as sim, client(sim) as c:

        def at(t: float, messages: list[dict[str, Any]]) -> tuple[int, int, int]:
            clock.now = t
            return usage_of(c.messages.create(model=MODEL, max_tokens=50, messages=messages))

        assert at(0.0, first) == (0, 2000, 0)
        assert at(200.0, longer)[2] == 2000
        assert at(450.0, first) == (0, 0, 2000)  # expired at 300 but for the read at 200


def test_one_hour_writes_come_first_and_cost_twice_the_input_price() -> None:
    """Tokens up to the last 1h breakpoint are 1-hour writes (2x input), the rest up to the
    last breakpoint 5-minute writes (1.25x); once the 5m entry expires the 1h prefix is
    still read, found by looking back from the later breakpoint."""
    clock = FakeClock()
    system = [cached_text(text(2000, "stable"), "1h")]
    messages = [user(cached_text(text(1000, "record")))]
    with Simulator(SimConfig(), clock=clock) as sim, client(sim) as c:
        first = c.messages.create(model=MODEL, max_tokens=50, system=system, messages=messages)
        clock.advance(360.0)
        later = c.messages.create(model=MODEL, max_tokens=50, system=system, messages=messages)
        charge = sim.bill.charges()[0]
    created = first.usage.cache_creation
    assert (created.ephemeral_1h_input_tokens, created.ephemeral_5m_input_tokens) == (2000, 1000)
    assert charge.usd == pytest.approx(
        (2000 * 3 * 2 + 1000 * 3 * 1.25 + first.usage.output_tokens * 15) / 1e6
    )
    assert (charge.cache_write_1h_tokens, charge.cache_write_5m_tokens) == (2000, 1000)
    assert usage_of(later) == (0, 1000, 2000)


def test_a_one_hour_breakpoint_after_a_five_minute_one_is_refused() -> None:
    """Breakpoints of 1h must precede those of 5m, in tools-system-messages order."""
    system = [cached_text("a"), cached_text("b", "1h")]
    with Simulator(SimConfig()) as sim:
        status, _, body = raw(sim, "POST", "/v1/messages", params(system=system))
    assert status == 400 and "ttl='1h'" in body["error"]["message"]


@pytest.mark.parametrize(("added", "read"), [(20, 1100), (21, 0)])
def test_a_breakpoint_looks_back_twenty_blocks_for_an_earlier_entry(added: int, read: int) -> None:
    """A breakpoint finds an entry at its own block or up to 20 blocks before it, not 21."""
    system = text(1100, "system")
    with Simulator(SimConfig()) as sim, client(sim) as c:
        c.messages.create(**params(), system=[cached_text(system)])
        parts = [plain(f"part {i}") for i in range(added - 1)] + [cached_text("last part")]
        second = c.messages.create(
            model=MODEL, max_tokens=50, system=system, messages=[user(*parts)]
        )
    assert second.usage.cache_read_input_tokens == read


def test_the_automatic_breakpoint_caches_the_whole_prompt() -> None:
    """Top-level cache_control marks the last block: a repeat reads the whole prompt."""
    body = params(text(1500, "doc"), cache_control={"type": "ephemeral"})
    with Simulator(SimConfig()) as sim, client(sim) as c:
        first = c.messages.create(**body)
        again = c.messages.create(**body)
    assert usage_of(first) == (0, 1500, 0) and usage_of(again) == (0, 0, 1500)


def _request(**changes: Any) -> MessagesRequest:
    tool = {"name": "feedback", "input_schema": {"type": "object", "properties": {}}}
    body = {
        **params([plain("question"), plain("more")]),
        "system": [plain("rules"), plain("record")],
        "tools": [tool],
        **changes,
    }
    request = parse_messages(SimConfig(), body)
    assert isinstance(request, MessagesRequest)
    return request


def test_what_a_prefix_depends_on() -> None:
    """A prefix's key ignores where breakpoints sit but changes with the model, the tools
    (everything after them), output_config's format (system and messages) and tool_choice
    (messages only), as Anthropic documents the invalidations."""
    base = prefix_of(_request()).keys  # blocks: tool, 2 system, 2 message
    moved = prefix_of(_request(system=[cached_text("rules"), plain("record")])).keys
    assert moved == base
    other_model = prefix_of(_request(model="claude-haiku-4-5")).keys
    assert all(a != b for a, b in zip(base, other_model, strict=True))
    new_tool = {"name": "other", "input_schema": {"type": "object", "properties": {}}}
    assert all(
        a != b for a, b in zip(base, prefix_of(_request(tools=[new_tool])).keys, strict=True)
    )
    fmt = {"format": {"type": "json_schema", "schema": {"type": "object"}}}
    formatted = prefix_of(_request(output_config=fmt)).keys
    assert formatted[0] == base[0] and all(
        a != b for a, b in zip(base[1:], formatted[1:], strict=True)
    )
    chosen = prefix_of(_request(tool_choice={"type": "tool", "name": "feedback"})).keys
    assert chosen[:3] == base[:3] and chosen[3] != base[3] and chosen[4] != base[4]


def test_a_string_and_its_text_block_are_the_same_prefix() -> None:
    """Content given as a string caches as the equivalent text block."""
    as_string = prefix_of(_request(messages=[{"role": "user", "content": "question"}]))
    as_block = prefix_of(_request(messages=[user(plain("question"))]))
    assert as_string == as_block


def test_forced_tool_calls_share_the_tools_and_system_prefix() -> None:
    """Switching tool_choice between calls keeps the tools' and system's cache (it only
    invalidates the messages'), so a feedback call forcing a tool still reads it."""
    tool = {
        "name": "feedback",
        "input_schema": {"type": "object", "properties": {"done": {"type": "boolean"}}},
    }
    system = [cached_text(text(1500, "stable"))]
    with Simulator(SimConfig()) as sim, client(sim) as c:
        c.messages.create(**params(), system=system, tools=[tool])
        forced = c.messages.create(
            **params(),
            system=system,
            tools=[tool],
            tool_choice={"type": "tool", "name": "feedback"},
        )
    tool_tokens = -(
        -(len("feedback") + 2 + len('{"properties":{"done":{"type":"boolean"}},"type":"object"}'))
        // 4
    )
    assert forced.usage.cache_read_input_tokens == 1500 + tool_tokens
    assert forced.content[0].type == "tool_use"


def test_no_breakpoint_no_cache() -> None:
    """Without any cache_control nothing is written or read, however long the prompt."""
    with Simulator(SimConfig()) as sim, client(sim) as c:
        usages = [usage_of(c.messages.create(**params(text(5000)))) for _ in range(2)]
    assert usages == [(5000, 0, 0), (5000, 0, 0)]
    assert len(sim.anthropic_cache) == 0


def test_the_sdk_sees_a_cache_control_type_error() -> None:
    """A cache_control of another type than ephemeral is a 400 naming the field."""
    bad = {"type": "text", "text": "x", "cache_control": {"type": "persistent"}}
    with (
        Simulator(SimConfig()) as sim,
        client(sim) as c,
        pytest.raises(anthropic.BadRequestError) as info,
    ):
        c.messages.create(**params(), system=[bad])
    assert "system.0.cache_control.type" in info.value.body["error"]["message"]
