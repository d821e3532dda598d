"""The simulator's faults as real providers send them, driven by the real ``openai`` client."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from pipeline.testing.simulator import SimConfig, Simulator, main

ROOT = Path(__file__).resolve().parents[2]


def msgs(text: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": text}]


def client(server: Simulator) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="k", max_retries=0, timeout=5.0)


def status_error(c: openai.OpenAI, text: str, **kw: Any) -> openai.APIStatusError:
    """The error answer to one chat request (the test fails if it succeeds)."""
    with pytest.raises(openai.APIStatusError) as info:
        c.chat.completions.create(model="m", messages=msgs(text), **kw)
    return info.value


@pytest.mark.parametrize(
    ("unit", "header", "value"), [("s", "retry-after", "3"), ("ms", "retry-after-ms", "3000")]
)
def test_5xx_answers_carry_the_configured_retry_after(unit: str, header: str, value: str) -> None:
    """With retry_after_s set, 500s, 503s and outage 503s say how long to wait, in s or ms."""
    for config in (
        SimConfig(p_500=1.0, retry_after_s=3, retry_after_unit=unit),
        SimConfig(p_503=1.0, retry_after_s=3, retry_after_unit=unit),
        SimConfig(outages=((0, 100),), retry_after_s=3, retry_after_unit=unit),
    ):
        with Simulator(config) as server, client(server) as c:
            err = status_error(c, "q")
        assert err.status_code >= 500
        assert err.response.headers[header] == value


def test_no_retry_after_unless_configured() -> None:
    """A plain 503 carries no Retry-After."""
    with Simulator(SimConfig(p_503=1.0)) as server, client(server) as c:
        err = status_error(c, "q")
    assert "retry-after" not in err.response.headers
    assert "retry-after-ms" not in err.response.headers


def test_poison_marker_fails_only_the_requests_holding_it() -> None:
    """A request whose messages hold the marker always gets a 500; others are answered."""
    with Simulator(SimConfig(poison="<<crash>>")) as server, client(server) as c:
        for _ in range(3):
            assert status_error(c, "please <<crash>> now").status_code == 500
        assert c.chat.completions.create(model="m", messages=msgs("fine")).choices
        outcomes = [r.outcome for r in server.requests]
    assert outcomes == ["poison", "poison", "poison", "ok"]


def test_context_limit_gives_openais_context_length_400() -> None:
    """A prompt plus max_tokens past context_limit gets 400 context_length_exceeded."""
    with Simulator(SimConfig(context_limit=100)) as server, client(server) as c:
        err = status_error(c, "word " * 200, max_tokens=10)
        assert c.chat.completions.create(model="m", messages=msgs("short"), max_tokens=60)
        assert [r.status for r in server.requests] == [400, 200]
    assert err.status_code == 400
    assert isinstance(err.body, dict)
    assert err.body["code"] == "context_length_exceeded"
    assert "maximum context length is 100 tokens" in err.body["message"]


def test_throttle_window_answers_429_without_retry_after() -> None:
    """Inside a throttle window every request gets a 429 with no Retry-After at all."""
    with Simulator(SimConfig(throttles=((0, 100),))) as server, client(server) as c:
        err = status_error(c, "q")
    assert err.status_code == 429
    assert isinstance(err.body, dict) and err.body["code"] == "rate_limit_exceeded"
    assert not {"retry-after", "retry-after-ms"} & set(err.response.headers)


def test_quota_runs_out_after_the_answers_it_covers() -> None:
    """After quota_requests answers every request gets OpenAI's 429 insufficient_quota."""
    with Simulator(SimConfig(quota_requests=2)) as server, client(server) as c:
        for i in range(2):
            c.chat.completions.create(model="m", messages=msgs(f"q{i}"))
        err = status_error(c, "q3")
    assert err.status_code == 429
    assert isinstance(err.body, dict) and err.body["code"] == "insufficient_quota"
    assert "exceeded your current quota" in err.body["message"]


def test_cli_flags_reach_the_real_faults(tmp_path: Path) -> None:
    """The CLI's flags for the real faults set the same config, and bad values exit 2."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [str(ROOT / "scripts" / "simulator"), "--poison", "BOOM", "--retry-after", "2"]
    cmd += ["--retry-after-unit", "ms", "--context-limit", "50", "--throttle", "100:200"]
    cmd += ["--quota", "10"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().split()[1]
            with openai.OpenAI(base_url=url, api_key="k", max_retries=0) as c:
                with pytest.raises(openai.InternalServerError) as crash:
                    c.chat.completions.create(model="m", messages=msgs("BOOM"))
                with pytest.raises(openai.BadRequestError):
                    c.chat.completions.create(model="m", messages=msgs("x " * 200))
        finally:
            proc.terminate()
            proc.wait(timeout=5)
    assert crash.value.response.headers["retry-after-ms"] == "2000"
    assert main(["--poison-status", "404"]) == 2
    assert main(["--retry-after", "-1"]) == 2
