#!/usr/bin/env python3
"""How long a local Ray instance's processes outlive a SIGKILLed `refine --workers`.

Starts `refine run code-improve --workers 1` (its own local Ray) against the simulator,
SIGKILLs it once three calls are checkpointed, then watches every Ray process the run had
started (server, raylet, workers, agents) and prints, for each component, how many seconds
after the kill its last process ended. Needs `refine[ray]`.

Usage: scripts/ray_after_kill.py [--limit SECONDS]   (stop watching after this; default 300)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.testing.simulator import SimConfig, Simulator  # noqa: E402
from tests.backends.ray.test_cluster import ray_processes  # noqa: E402
from tests.helpers import tasks, wait_for_calls, write_jsonl  # noqa: E402


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=float, default=300.0, help="seconds to watch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Simulator(SimConfig(latency_s=0.2)) as sim:
        inp = write_jsonl(Path(tmp) / "in.jsonl", tasks(200))
        run_dir = Path(tmp) / "run"
        env = {**os.environ, "OPENAI_API_KEY": "sk-test", "RAY_ADDRESS": ""}
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "run", "code-improve", str(inp),
             "--out", str(run_dir), "--base-url", sim.url, "--model", "sim-model",
             "--workers", "1", "--quiet"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        wait_for_calls(run_dir, 3, proc, limit_s=120)
        if proc.poll() is not None:
            sys.exit("the run ended before it could be killed")
        components = {
            pid: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode().split("/")[-1]
            for pid in ray_processes(under=proc.pid)
        }
        proc.kill()
        proc.wait()
        killed = time.monotonic()
        ended: dict[str, float] = {}
        while time.monotonic() - killed < args.limit:
            running = {component for pid, component in components.items() if alive(pid)}
            for component in set(components.values()) - running - ended.keys():
                ended[component] = round(time.monotonic() - killed, 1)
            if not running:
                break
            time.sleep(0.2)
    for component in sorted(set(components.values())):
        when = ended.get(component)
        shown = f"{when} s" if when is not None else f"still running after {args.limit:g} s"
        print(f"{component}: ended {shown} after the kill")


if __name__ == "__main__":
    main()
