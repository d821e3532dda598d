"""Tests of the simulator's Files and Batch APIs, driven by the real ``openai`` client."""

from __future__ import annotations

import asyncio
import io
import random
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import openai
import orjson
import pytest
from openai.types import Batch

from pipeline.testing.simulator import RequestLog, SimConfig, Simulator
from pipeline.testing.simulator.batches import BatchStore, make_plan
from pipeline.testing.simulator.engine import Engine
from pipeline.testing.simulator.files import FileStore, MultipartError, parse_multipart
from pipeline.testing.simulator.log import RequestLogger

KEY = "sk-batch-test"
FAST = SimConfig(api_key=KEY, batch_validating_s=0.02, batch_delay_s=0.1, batch_finalizing_s=0.02)
TERMINAL = ("completed", "failed", "expired", "cancelled")


def chat_line(custom_id: str, model: str = "m", **body: Any) -> dict[str, Any]:
    """One batch input line asking ``model`` a question named after ``custom_id``."""
    request = {"model": model, "messages": [{"role": "user", "content": f"q {custom_id}"}]}
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {**request, "max_tokens": 50, **body},
    }


def jsonl(*rows: Any) -> bytes:
    """Rows as JSONL bytes."""
    return b"".join(orjson.dumps(row) + b"\n" for row in rows)


def lines(n: int, model: str = "m") -> bytes:
    """``n`` valid input lines, custom ids ``c0``..."""
    return jsonl(*(chat_line(f"c{i}", model) for i in range(n)))


def client(sim: Simulator, key: str = KEY) -> openai.OpenAI:
    """A client of ``sim`` that never retries."""
    return openai.OpenAI(base_url=sim.url, api_key=key, max_retries=0, timeout=10)


def submit(c: openai.OpenAI, data: bytes, **kw: Any) -> Batch:
    """Upload ``data`` and create a batch over it."""
    uploaded = c.files.create(file=("input.jsonl", data), purpose="batch")
    return c.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        **kw,
    )


def wait(c: openai.OpenAI, batch_id: str, until: tuple[str, ...] = TERMINAL) -> Batch:
    """Poll a batch until its status is one of ``until``."""
    deadline = time.monotonic() + 10
    while (batch := c.batches.retrieve(batch_id)).status not in until:
        assert time.monotonic() < deadline, f"batch stuck in {batch.status}"
        time.sleep(0.01)
    return batch


def completed(batch: Batch) -> int:
    """Lines of a batch finished so far."""
    return batch.request_counts.completed if batch.request_counts else 0


def read(c: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    """The JSONL lines of a file."""
    assert file_id is not None
    return [orjson.loads(x) for x in c.files.content(file_id).content.splitlines()]


@pytest.fixture
def sim() -> Iterator[Simulator]:
    """A simulator with short batch phases and an API key."""
    with Simulator(FAST) as server:
        yield server


# -- Files API -------------------------------------------------------------------------------


def test_file_upload_retrieve_content_list_delete(sim: Simulator) -> None:
    """An upload comes back as a FileObject, its bytes verbatim, listed newest first, deletable."""
    data = lines(3)
    with client(sim) as c:
        first = c.files.create(file=("input.jsonl", data), purpose="batch")
        second = c.files.create(file=("notes.txt", io.BytesIO(b"x")), purpose="user_data")
        assert (first.object, first.bytes, first.filename) == ("file", len(data), "input.jsonl")
        assert first.purpose == "batch" and first.status == "processed"
        assert first.expires_at is not None and first.expires_at > first.created_at
        assert c.files.retrieve(first.id) == first
        assert c.files.content(first.id).content == data
        assert [f.id for f in c.files.list()] == [second.id, first.id]
        assert [f.id for f in c.files.list(purpose="batch")] == [first.id]
        deleted = c.files.delete(first.id)
        assert deleted.deleted and deleted.id == first.id
        with pytest.raises(openai.NotFoundError):
            c.files.retrieve(first.id)
        with pytest.raises(openai.NotFoundError):
            c.files.content(first.id)
        assert [f.id for f in c.files.list()] == [second.id]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"file": ("input.txt", b"{}\n"), "purpose": "batch"}, "file"),
        ({"file": ("input.jsonl", b"{}\n"), "purpose": "nonsense"}, "purpose"),
    ],
)
def test_upload_refuses_bad_forms(sim: Simulator, kwargs: dict[str, Any], param: str) -> None:
    """A batch file not named .jsonl, or an unknown purpose, is refused with a 400."""
    with client(sim) as c, pytest.raises(openai.BadRequestError) as err:
        c.files.create(**kwargs)
    assert err.value.param == param


def test_files_and_batches_need_the_key(sim: Simulator) -> None:
    """The Files and Batch APIs answer a wrong key with 401, without echoing it."""
    with client(sim, key="sk-wrong-key-0000") as c:
        for call in (
            lambda: c.files.create(file=("input.jsonl", b"{}\n"), purpose="batch"),
            lambda: c.files.list(),
            lambda: c.batches.list(),
            lambda: c.batches.retrieve("batch_x"),
        ):
            with pytest.raises(openai.AuthenticationError) as err:
                call()
            assert "sk-wrong-key-0000" not in err.value.message


def test_large_and_chunked_uploads(sim: Simulator) -> None:
    """/v1/files takes bodies past the 64 MB limit of other routes, and chunked bodies."""
    big = b'{"pad": "' + b"x" * (70 * 1024 * 1024) + b'"}\n'
    with client(sim) as c:
        assert c.files.create(file=("big.jsonl", big), purpose="batch").bytes == len(big)
    head = "POST {} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n"
    too_big = head.format("/v1/chat/completions", 70 * 1024 * 1024).encode()
    assert _exchange(sim.port, too_big).startswith(b"HTTP/1.1 413")
    assert _exchange(sim.port, head.format("/v1/files", 600 << 20).encode()).startswith(
        b"HTTP/1.1 413"
    )
    form = (
        b'--BB\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--BB\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n" + lines(2) + b"\r\n--BB--\r\n"
    )
    pieces = [form[:7], form[7:100], form[100:]]
    chunked = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\nX-T: 1\r\n\r\n"
    request = (
        b"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n"
        b"Content-Type: multipart/form-data; boundary=BB\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: close\r\n\r\n" + chunked
    )
    reply = _exchange(sim.port, request, split_at=(30, 200, len(request) - 5))
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    file_id = orjson.loads(reply.split(b"\r\n\r\n", 1)[1])["id"]
    with client(sim) as c:
        assert c.files.content(file_id).content == lines(2)


def _exchange(port: int, payload: bytes, split_at: tuple[int, ...] = ()) -> bytes:
    """Send ``payload`` (in pieces cut at ``split_at``), read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        start = 0
        for cut in (*split_at, len(payload)):
            s.sendall(payload[start:cut])
            start = cut
            time.sleep(0.01)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("content_type", "body", "expected"),
    [
        (
            "multipart/form-data; boundary=b1",
            b'--b1\r\nContent-Disposition: form-data; name="a"\r\n\r\nx\r\ny\r\n--b1--\r\n',
            {"a": (b"x\r\ny", None)},
        ),
        (
            'multipart/form-data; boundary="q q"',
            b'preamble\r\n--q q\r\nContent-Disposition: form-data; name="f"; filename="a.jsonl"'
            b"\r\nContent-Type: text/plain\r\n\r\n\r\n--q q\r\n"
            b'Content-Disposition: form-data; name="p"\r\n\r\nbatch\r\n--q q--',
            {"f": (b"", "a.jsonl"), "p": (b"batch", None)},
        ),
    ],
)
def test_parse_multipart(
    content_type: str, body: bytes, expected: dict[str, tuple[bytes, str | None]]
) -> None:
    """Form fields come out with their exact bytes and file names."""
    parts = parse_multipart(content_type, body)
    assert {k: (v.data, v.filename) for k, v in parts.items()} == expected


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/json", b"{}"),
        ("multipart/form-data", b"--b\r\n"),
        ("multipart/form-data; boundary=b", b"no boundary here"),
        ("multipart/form-data; boundary=b", b'--b\r\nContent-Disposition: form-data; name="a"'),
        ("multipart/form-data; boundary=b", b"--b\r\nX: y\r\n\r\nv\r\n--b--"),
    ],
)
def test_parse_multipart_rejects_malformed(content_type: str, body: bytes) -> None:
    """Bodies that are not well-formed multipart/form-data raise MultipartError."""
    with pytest.raises(MultipartError):
        parse_multipart(content_type, body)


# -- Batch API: lifecycle --------------------------------------------------------------------


def test_batch_completes_with_shuffled_output_and_logged_lines(sim: Simulator) -> None:
    """A batch completes with each line answered once by the chat engine, shuffled, logged."""
    with client(sim) as c:
        created = submit(c, lines(20), metadata={"run": "r1"})
        assert created.status == "validating" and created.metadata == {"run": "r1"}
        batch = wait(c, created.id)
        assert batch.status == "completed" and batch.metadata == {"run": "r1"}
        assert batch.request_counts is not None
        assert (batch.request_counts.total, batch.request_counts.completed) == (20, 20)
        assert batch.request_counts.failed == 0 and batch.error_file_id is None
        assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
        assert created.created_at <= batch.in_progress_at <= batch.completed_at
        assert batch.expires_at == batch.created_at + 24 * 3600 and batch.model == "m"
        out = read(c, batch.output_file_id)
        ids = [x["custom_id"] for x in out]
        assert sorted(ids, key=lambda i: int(i[1:])) == [f"c{i}" for i in range(20)]
        assert ids != sorted(ids, key=lambda i: int(i[1:]))
        assert all(x["id"].startswith("batch_req_") and x["error"] is None for x in out)
        bodies = {x["custom_id"]: x["response"]["body"] for x in out}
        assert {x["response"]["status_code"] for x in out} == {200}
        assert batch.usage is not None
        assert batch.usage.input_tokens == sum(b["usage"]["prompt_tokens"] for b in bodies.values())
        log = sim.requests
        assert all(r.is_batch and r.batch_id == batch.id and r.model == "m" for r in log)
        assert sorted(r.custom_id or "" for r in log) == sorted(ids)  # each line exactly once
        assert {r.custom_id: r.completion_tokens for r in log} == {
            i: b["usage"]["completion_tokens"] for i, b in bodies.items()
        }
        realtime = c.chat.completions.create(**chat_line("c7")["body"])
        assert (
            realtime.choices[0].message.content == bodies["c7"]["choices"][0]["message"]["content"]
        )
        assert not sim.requests[-1].is_batch


def test_unshuffled_output_keeps_input_order() -> None:
    """With batch_shuffle off, output lines come in input order."""
    with Simulator(replace(FAST, batch_shuffle=False)) as server, client(server) as c:
        batch = wait(c, submit(c, lines(8)).id)
        assert [x["custom_id"] for x in read(c, batch.output_file_id)] == [
            f"c{i}" for i in range(8)
        ]


def test_failed_lines_go_to_the_error_file() -> None:
    """p_line_fail puts lines in the error file with status and error body, reproducibly."""

    def run() -> tuple[set[str], list[RequestLog]]:
        config = replace(FAST, p_line_fail=0.5, line_fail_statuses=(500, 429, 400))
        with Simulator(config) as server, client(server) as c:
            batch = wait(c, submit(c, lines(30)).id)
            assert batch.status == "completed" and batch.request_counts is not None
            ok, failed = read(c, batch.output_file_id), read(c, batch.error_file_id)
            assert batch.request_counts.completed == len(ok)
            assert batch.request_counts.failed == len(failed)
            assert {x["custom_id"] for x in ok} | {x["custom_id"] for x in failed} == {
                f"c{i}" for i in range(30)
            }
            assert {x["response"]["status_code"] for x in failed} == {500, 429, 400}
            assert all(x["response"]["body"]["error"]["message"] for x in failed)
            return {x["custom_id"] for x in failed}, server.requests

    failed, log = run()
    assert 5 <= len(failed) <= 25
    assert {r.custom_id for r in log if r.status != 200} == failed
    assert all(r.total_tokens == 0 for r in log if r.status != 200)
    assert run()[0] == failed


def test_lines_are_answered_like_real_time_requests() -> None:
    """A line with a bad body fails alone with the 400 a real-time call gets; p_refusal refuses."""
    bad = chat_line("bad")
    del bad["body"]["messages"]
    with Simulator(replace(FAST, p_refusal=1.0)) as server, client(server) as c:
        batch = wait(c, submit(c, jsonl(chat_line("good"), bad)).id)
        assert batch.status == "completed"
        (failed,) = read(c, batch.error_file_id)
        assert failed["custom_id"] == "bad" and failed["response"]["status_code"] == 400
        assert failed["response"]["body"]["error"]["param"] == "messages"
        (answered,) = read(c, batch.output_file_id)
        message = answered["response"]["body"]["choices"][0]["message"]
        assert message["content"] is None and message["refusal"]
        outcomes = sorted((r.custom_id or "", r.outcome) for r in server.requests)
        assert outcomes == [("bad", "bad_request"), ("good", "refusal")]


def test_all_failed_batch_is_completed_with_only_an_error_file() -> None:
    """A batch whose every line failed is completed, with no output file."""
    with Simulator(replace(FAST, p_line_fail=1.0)) as server, client(server) as c:
        batch = wait(c, submit(c, lines(4)).id)
        assert batch.status == "completed" and batch.output_file_id is None
        assert batch.request_counts is not None and batch.request_counts.failed == 4
        assert len(read(c, batch.error_file_id)) == 4


def test_expired_batch_keeps_its_finished_lines() -> None:
    """An expiring batch finishes expire_fraction of its lines; the rest are batch_expired."""
    config = replace(FAST, p_batch_expire=1.0, expire_fraction=0.5)
    with Simulator(config) as server, client(server) as c:
        batch = wait(c, submit(c, lines(10)).id)
        assert batch.status == "expired" and batch.expired_at is not None
        assert batch.completed_at is None
        done, expired = read(c, batch.output_file_id), read(c, batch.error_file_id)
        assert len(done) == 5 and {x["response"]["status_code"] for x in done} == {200}
        assert len(expired) == 5 and all(x["response"] is None for x in expired)
        assert {x["error"]["code"] for x in expired} == {"batch_expired"}
        assert {x["custom_id"] for x in done} == {r.custom_id for r in server.requests}
        assert batch.request_counts is not None
        assert (batch.request_counts.completed, batch.request_counts.failed) == (5, 5)


def test_cancel_keeps_finished_lines_and_is_idempotent() -> None:
    """Cancel keeps finished lines and reports the rest as batch_cancelled, once."""
    with Simulator(replace(FAST, batch_delay_s=2.0)) as server, client(server) as c:
        created = submit(c, lines(12))
        deadline = time.monotonic() + 5
        while not completed(c.batches.retrieve(created.id)):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        cancelling = c.batches.cancel(created.id)
        assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
        batch = wait(c, created.id)
        assert batch.status == "cancelled" and batch.cancelled_at is not None
        done, cancelled = read(c, batch.output_file_id), read(c, batch.error_file_id)
        assert 1 <= len(done) < 12 and len(done) + len(cancelled) == 12
        assert {x["error"]["code"] for x in cancelled} == {"batch_cancelled"}
        assert len(server.requests) == len(done)
        assert c.batches.cancel(created.id).status == "cancelled"
        finished = wait(c, submit(c, lines(1)).id)
        with pytest.raises(openai.ConflictError):
            c.batches.cancel(finished.id)


# -- Batch API: validation and limits --------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "data", "code", "line"),
    [
        ({}, lines(1) + b"{not json\n", "invalid_json_line", 2),
        ({}, jsonl(chat_line("a"), {**chat_line("b"), "url": "/v1/embeddings"}), "invalid_url", 2),
        ({}, jsonl({**chat_line("a"), "method": "GET"}), "invalid_method", 1),
        (
            {},
            jsonl({k: v for k, v in chat_line("a").items() if k != "custom_id"}),
            "missing_required_parameter",
            1,
        ),
        ({}, jsonl(chat_line("a"), chat_line("b"), chat_line("a")), "duplicate_custom_id", 3),
        ({}, jsonl(chat_line("a", "m"), chat_line("b", "n")), "mismatched_model", 2),
        ({"models": ("m",)}, jsonl(chat_line("a", "zzz")), "model_not_found", 1),
        ({"batch_max_requests": 3}, lines(4), "too_many_requests", None),
        ({"batch_max_bytes": 100}, lines(2), "file_too_large", None),
        ({}, b"\n\n", "empty_file", None),
    ],
)
def test_validation_failures(
    config: dict[str, Any], data: bytes, code: str, line: int | None
) -> None:
    """A bad input file fails the batch in validation with the matching error."""
    with Simulator(replace(FAST, **config)) as server, client(server) as c:
        batch = wait(c, submit(c, data).id)
        assert batch.status == "failed" and batch.failed_at is not None
        assert batch.errors is not None and batch.errors.object == "list"
        assert batch.errors.data is not None
        assert [(e.code, e.line) for e in batch.errors.data] == [(code, line)]
        assert batch.output_file_id is None and batch.error_file_id is None
        assert batch.in_progress_at is None and server.requests == []


def test_token_limit_is_per_model_and_freed_by_finished_batches() -> None:
    """Past a model's enqueued-token limit a batch fails with token_limit_exceeded."""
    # Each line holds 1 prompt token + 50 max tokens; four lines hold 204, six 306.
    config = replace(FAST, batch_token_limit=300)
    with Simulator(replace(config, batch_delay_s=2.0)) as server, client(server) as c:
        holder = submit(c, lines(4))
        server.set_config(config)  # only the holder takes long
        wait(c, holder.id, until=("in_progress",))
        refused = wait(c, submit(c, lines(4)).id)
        assert refused.status == "failed" and refused.errors and refused.errors.data
        assert refused.errors.data[0].code == "token_limit_exceeded"
        assert "300" in (refused.errors.data[0].message or "")
        assert wait(c, submit(c, lines(4, "other")).id).status == "completed"
        assert c.batches.cancel(holder.id).status == "cancelling"
        assert wait(c, holder.id).status == "cancelled"
        assert wait(c, submit(c, lines(4)).id).status == "completed"
        alone = wait(c, submit(c, lines(6)).id)  # 312 tokens: over the limit by itself
        assert alone.status == "failed"


def test_create_over_max_in_progress_is_refused_with_429() -> None:
    """Past batch_max_in_progress batches in flight, creating one answers 429."""
    config = replace(FAST, batch_max_in_progress=1)
    with Simulator(replace(config, batch_delay_s=5.0)) as server, client(server) as c:
        first = submit(c, lines(1))
        server.set_config(config)
        with pytest.raises(openai.RateLimitError) as err:
            submit(c, lines(1))
        assert err.value.code == "rate_limit_exceeded"
        c.batches.cancel(first.id)
        with pytest.raises(openai.RateLimitError):  # cancelling is still in flight
            submit(c, lines(1))
        assert wait(c, first.id).status == "cancelled"
        assert wait(c, submit(c, lines(1)).id).status == "completed"
        assert len(server.batches) == 2


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"endpoint": "/v1/embeddings"}, "endpoint"),
        ({"completion_window": "1h"}, "completion_window"),
        ({"input_file_id": "file-missing"}, "input_file_id"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"metadata": {"k": "v" * 513}}, "metadata"),
    ],
)
def test_create_refuses_bad_parameters(sim: Simulator, change: dict[str, Any], param: str) -> None:
    """Bad create parameters are refused with a 400 naming the parameter."""
    with client(sim) as c:
        file_id = c.files.create(file=("input.jsonl", lines(1)), purpose="batch").id
        params: dict[str, Any] = {
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            **change,
        }
        with pytest.raises(openai.BadRequestError) as err:
            c.batches.create(**params)
        assert err.value.param == param
    assert sim.batches == []


def test_input_file_must_have_purpose_batch(sim: Simulator) -> None:
    """A file uploaded for another purpose cannot feed a batch."""
    with client(sim) as c:
        other = c.files.create(file=("input.jsonl", lines(1)), purpose="user_data")
        with pytest.raises(openai.BadRequestError):
            c.batches.create(
                input_file_id=other.id, endpoint="/v1/chat/completions", completion_window="24h"
            )


def test_list_pages_newest_first_with_metadata(sim: Simulator) -> None:
    """Batches list newest first in cursor pages, with their metadata."""
    with client(sim) as c:
        made = [submit(c, lines(1), metadata={"intent": f"i{k}"}).id for k in range(5)]
        first = c.batches.list(limit=2)
        assert [b.id for b in first.data] == made[:2:-1][:2] == [made[4], made[3]]
        assert first.has_more
        assert [b.id for b in c.batches.list(limit=2, after=made[3]).data] == [made[2], made[1]]
        last = c.batches.list(limit=2, after=made[1])
        assert [b.id for b in last.data] == [made[0]] and not last.has_more
        assert [b.id for b in c.batches.list(limit=2)] == made[::-1]  # auto-pagination
        found = [b.id for b in c.batches.list() if (b.metadata or {}).get("intent") == "i2"]
        assert found == [made[2]]
        with pytest.raises(openai.NotFoundError):
            c.batches.retrieve("batch_unknown")


def test_simulators_keep_separate_batches() -> None:
    """Two simulators are two endpoints: one's batches and files are unknown to the other."""
    with Simulator(FAST) as one, Simulator(FAST) as two, client(one) as c1, client(two) as c2:
        batch = submit(c1, lines(1))
        assert [b.id for b in c2.batches.list()] == []
        with pytest.raises(openai.NotFoundError):
            c2.batches.retrieve(batch.id)
        assert len(one.batches) == 1 and two.batches == []


def test_async_client_with_aiohttp_transport(sim: Simulator) -> None:
    """The SDK's aiohttp transport (the pipeline's) uploads, creates and reads batches."""

    async def go() -> list[dict[str, Any]]:
        async with openai.AsyncOpenAI(
            base_url=sim.url, api_key=KEY, max_retries=0, http_client=openai.DefaultAioHttpClient()
        ) as c:
            uploaded = await c.files.create(file=("input.jsonl", lines(3)), purpose="batch")
            batch = await c.batches.create(
                input_file_id=uploaded.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
            while batch.status not in TERMINAL:
                await asyncio.sleep(0.01)
                batch = await c.batches.retrieve(batch.id)
            assert batch.output_file_id is not None
            content = await c.files.content(batch.output_file_id)
            return [orjson.loads(x) for x in content.content.splitlines()]

    assert len(asyncio.run(go())) == 3


def test_batch_lines_use_the_model_they_name() -> None:
    """Each batch line and real-time call is answered and logged by the model it names."""
    config = replace(FAST, models=("gen", "critic"))
    with Simulator(config) as server, client(server) as c:
        batch = wait(c, submit(c, lines(3, "critic")).id)
        answers = read(c, batch.output_file_id)
        assert {x["response"]["body"]["model"] for x in answers} == {"critic"}
        r = c.chat.completions.create(**chat_line("z", "gen")["body"])
        log = server.requests
        assert [x.model for x in log] == ["critic"] * 3 + ["gen"]
        assert r.usage is not None
        assert (log[-1].prompt_tokens, log[-1].completion_tokens) == (
            r.usage.prompt_tokens,
            r.usage.completion_tokens,
        )


# -- Batch API: plans and time, without a server ---------------------------------------------


@pytest.mark.parametrize(
    ("n", "config", "finish", "expires"),
    [
        (10, {}, 10, False),
        (10, {"p_batch_expire": 1.0, "expire_fraction": 0.5}, 5, True),
        (7, {"p_batch_expire": 1.0, "expire_fraction": 0.5}, 3, True),
        (4, {"p_batch_expire": 1.0, "expire_fraction": 0.0}, 0, True),
        (4, {"p_batch_expire": 1.0, "expire_fraction": 1.0}, 4, True),
        (0, {}, 0, False),
    ],
)
def test_make_plan_finish_counts(
    n: int, config: dict[str, Any], finish: int, expires: bool
) -> None:
    """An expiring plan finishes floor(n * expire_fraction) lines; others finish all."""
    plan = make_plan(n, replace(SimConfig(), **config), random.Random(1))
    assert (plan.finish, plan.expires, len(plan.fates)) == (finish, expires, n)
    assert sorted(plan.order) == list(range(n))


def test_make_plan_is_deterministic_and_honours_settings() -> None:
    """The same seed draws the same plan; no shuffle keeps order; p_line_fail=1 fails all."""
    cfg = SimConfig(p_line_fail=0.3, line_fail_statuses=(500, 400))
    assert make_plan(50, cfg, random.Random(3)) == make_plan(50, cfg, random.Random(3))
    assert make_plan(50, cfg, random.Random(3)) != make_plan(50, cfg, random.Random(4))
    plain = make_plan(50, replace(cfg, batch_shuffle=False), random.Random(3))
    assert plain.order == tuple(range(50))
    every = make_plan(50, replace(cfg, p_line_fail=1.0), random.Random(3))
    assert {f.fail_status for f in every.fates} == {500, 400}
    none = make_plan(50, replace(cfg, p_line_fail=0.0), random.Random(3))
    assert {f.fail_status for f in none.fates} == {None}


class _Clocked:
    """A batch store driven by explicit times (no server, no sleeping)."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.logger = RequestLogger(None, keep=True)
        self.files = FileStore()
        self.store = BatchStore(Engine(self.logger), self.files, wall0=1_700_000_000.0)

    def create(self, data: bytes, at: float) -> str:
        """Store ``data`` as a batch file and create a batch over it at time ``at``."""
        file_id = self.files.add("in.jsonl", "batch", data, 0).id
        body = {
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        reply = self.store.handle(self.config, "POST", "/v1/batches", "", orjson.dumps(body), at)
        assert reply.status == 200, reply.body
        batch_id: str = orjson.loads(reply.body)["id"]
        return batch_id

    def get(self, batch_id: str, at: float) -> dict[str, Any]:
        """The batch as retrieved at time ``at``."""
        reply = self.store.handle(self.config, "GET", f"/v1/batches/{batch_id}", "", b"", at)
        value: dict[str, Any] = orjson.loads(reply.body)
        return value


def test_lines_finish_steadily_over_the_in_progress_window() -> None:
    """Request counts advance in proportion to the time spent in progress."""
    world = _Clocked(SimConfig(batch_validating_s=1, batch_delay_s=10, batch_finalizing_s=1))
    batch_id = world.create(lines(100), at=0.0)
    progress = []
    for at in (0.5, 1.0, 3.5, 6.0, 10.99, 11.0, 11.5, 12.0):
        b = world.get(batch_id, at)
        progress.append((b["status"], b["request_counts"]["completed"]))
    assert progress == [
        ("validating", 0),
        ("in_progress", 0),
        ("in_progress", 25),
        ("in_progress", 50),
        ("in_progress", 99),
        ("finalizing", 100),
        ("finalizing", 100),
        ("completed", 100),
    ]
    assert len(world.logger.entries()) == 100
    b = world.get(batch_id, 12.0)
    assert (b["in_progress_at"], b["finalizing_at"], b["completed_at"]) == (
        1_700_000_001,
        1_700_000_011,
        1_700_000_012,
    )


def test_phase_ends_apply_in_time_order_however_late() -> None:
    """A validation counts the tokens held at its own time, however late it is computed."""
    config = SimConfig(
        batch_token_limit=300, batch_validating_s=5, batch_delay_s=1, batch_finalizing_s=0
    )
    world = _Clocked(config)
    late = world.create(lines(4), at=0.0)  # 204 tokens, validated at t=5
    world.config = replace(config, batch_validating_s=0, batch_delay_s=10)
    early = world.create(lines(4), at=0.0)  # holds 204 tokens from t=0 to t=10
    refused = world.get(late, 100.0)
    assert refused["status"] == "failed"
    assert refused["errors"]["data"][0]["code"] == "token_limit_exceeded"
    assert world.get(early, 100.0)["status"] == "completed"
    world.config = config
    after = world.create(lines(4), at=100.0)  # validated at t=105, nothing held by then
    assert world.get(after, 200.0)["status"] == "completed"
