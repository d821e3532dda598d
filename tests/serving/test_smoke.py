"""The install's check of the server: one answer, timed; a failure says what to do."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from pipeline.serving import LocalModel, ServerStartError
from pipeline.serving.smoke import completion, main, smoke

from .fakes import FAKE_SERVER


@pytest.fixture
def program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The fake llama-server, run by this interpreter."""
    script = tmp_path / "fake_llama_server.py"
    script.write_text(FAKE_SERVER)
    monkeypatch.delenv("REFINE_N_GPU_LAYERS", raising=False)
    return [sys.executable, str(script)]


@pytest.fixture
def model(tmp_path: Path) -> LocalModel:
    """A model file the fake server accepts."""
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF" + bytes(16))
    return LocalModel("tiny", path, None)


@pytest.mark.anyio
async def test_smoke_times_loading_and_answering(program: list[str], model: LocalModel) -> None:
    """The check returns the answer, its tokens, and the load and answer times of its clock."""
    ticks = itertools.count(start=10.0, step=1.5)
    result = await smoke(model, program=program, clock=lambda: next(ticks))
    assert (result.answer, result.completion_tokens) == ("ready", 2)
    assert (result.load_s, result.answer_s) == (1.5, 1.5)
    assert result.binary == Path(sys.executable)
    assert "tiny loaded in 1.5 s, 2 tokens ('ready') in 1.5 s" in result.summary()


@pytest.mark.anyio
async def test_smoke_of_a_server_dying_at_its_first_answer(
    program: list[str], model: LocalModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that starts, then crashes answering: the error has its exit, log and advice."""
    monkeypatch.setenv("FAKE_MODE", "crash_on_answer")
    with pytest.raises(ServerStartError) as caught:
        await smoke(model, program=program)
    message = str(caught.value)
    assert "started but did not answer" in message
    assert "ended with code -11" in message
    assert "crashed (SIGSEGV)" in message and "report it" in message


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ({"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": 1}}, None),
        ({"error": {"message": "loading model"}}, "not a chat completion"),
        ({"choices": [], "usage": {"completion_tokens": 1}}, "not a chat completion"),
        (
            {"choices": [{"message": {"content": ""}}], "usage": {"completion_tokens": 0}},
            "no answer",
        ),
    ],
)
def test_completion_reads_a_chat_answer(reply: dict[str, object], error: str | None) -> None:
    """A chat completion with at least one token is an answer; anything else is named."""
    if error is None:
        assert completion(reply) == ("hi", 1)
    else:
        with pytest.raises(ValueError, match=error):
            completion(reply)


def test_main_exits_2_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model that cannot be had: exit 2 and a refine: line saying why, nothing started."""
    assert main([str(tmp_path / "absent.gguf")]) == 2
    assert "refine: no such model file" in capsys.readouterr().err
