"""Progress display: a bar on a terminal, periodic plain lines otherwise."""

from __future__ import annotations

import io
import logging

import pytest

from pipeline.runs.progress import Counters, Progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_terminal_gets_a_bar_with_records_calls_and_tokens() -> None:
    """On a terminal the bar shows finished/total records, done, failed, calls, tokens, cost."""
    stream = _Tty()
    counters = Counters(lines=11, already=2, bad_lines=1, spent_usd=0.01234)
    progress = Progress(counters, stream=stream)
    counters.done, counters.failed, counters.calls = 3, 1, 9
    counters.prompt_tokens, counters.completion_tokens = 100, 20
    progress.tick()
    progress.close()
    text = stream.getvalue()
    assert "6/10" in text
    assert "done=3" in text and "failed=1" in text and "calls=9" in text and "tok=120" in text
    assert "$0.0123" in text


def test_pipe_gets_periodic_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    """Without a terminal, one plain line is logged per interval and nothing in between."""
    clock = _Clock()
    counters = Counters(lines=5, spent_usd=None)
    progress = Progress(counters, stream=io.StringIO(), interval_s=10, clock=clock)
    with caplog.at_level(logging.INFO, logger="refine"):
        progress.tick()
        clock.now = 9.9
        progress.tick()
        counters.done = 2
        clock.now = 10.0
        progress.tick()
    assert len(caplog.records) == 1
    line = caplog.records[0].getMessage()
    assert line.startswith("2/5 records finished; this invocation: 2 done, 0 failed")
    assert "run total: cost unknown" in line


def test_disabled_progress_prints_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """--quiet: neither a bar nor log lines."""
    stream = _Tty()
    clock = _Clock()
    progress = Progress(Counters(), enabled=False, stream=stream, interval_s=0, clock=clock)
    with caplog.at_level(logging.INFO, logger="refine"):
        clock.now = 100
        progress.tick()
        progress.close()
    assert stream.getvalue() == "" and not caplog.records
