#!/usr/bin/env python3
"""Which refine prompt lets the check steer a small model? One refinement per first draft.

Takes the first drafts and their feedback (critic notes plus check findings) from a
finished commongen run, e.g. condition (c) of scripts/quality.py, and sends only the
refine call for each, once per prompt variant, to the same local model:

  shipped          jobs/commongen.toml's refine prompt, check findings after the critic
  findings-first   the same prompt with the check findings before the critic's notes
  concepts-on-top  the shipped prompt under a line repeating the full concept list
  previous         the refine prompt before this comparison (concept list, "rewrite the
                   sentence"), findings first as the engine placed them then

Every variant refines the same drafts, so the gains are paired. Prints mean coverage
before and after, the gain in points, and how many answers came back unchanged.

Usage: scripts/refine_prompts.py [RUN_DIR] [--model qwen2.5-coder-1.5b] [--records 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import anyio
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.calls import Step  # noqa: E402
from pipeline.feedback import render_feedback  # noqa: E402
from pipeline.jobs import Job, load_job  # noqa: E402
from pipeline.loop import build_messages, feedback_text  # noqa: E402
from pipeline.records import Record, read_records  # noqa: E402
from pipeline.rundir import RunDir  # noqa: E402

RUN_DIR = ROOT / "runs" / "quality" / "commongen-c-qwen2.5-coder-1.5b-1"
PREVIOUS_REFINE = """Improve a sentence that must use every one of these words in a realistic \
scene (any form counts):

{{concepts}}

Earlier sentences and the feedback they received, oldest first (do not repeat their mistakes):

{{history}}

The latest sentence: {{output}}

Feedback on it:

{{feedback}}

Rewrite the sentence so that it uses every word of the list: first work in each missing word \
named in the feedback (any form counts), then fix each part that makes no sense. Keep every \
word already used.
Reply with the improved sentence only.
"""

Case = tuple[Record, list[Step]]  # a record and its [generate, feedback] steps
Variant = Callable[[Job, Record, list[Step]], list[dict[str, str]]]


def _critic(job: Job, fb: Step) -> str:
    return render_feedback(
        fb.parsed,
        fb.response or "",
        actions_field=job.actions_field,
        done_field=job.done_field,
        score_field=job.score_field,
    )


def _findings_first(job: Job, steps: list[Step]) -> str:
    """The merged feedback with the check block moved in front of the critic's notes."""
    critic = _critic(job, steps[1])
    merged = feedback_text(job, steps[1])
    checks = merged[len(critic) :].strip()
    return f"{checks}\n\n{critic}" if checks else critic


def _with_feedback(job: Job, record: Record, steps: list[Step], text: str) -> list[dict[str, str]]:
    """The shipped messages with the {{feedback}} part swapped for ``text``."""
    messages = build_messages(job, record, "refine", 1, steps)
    shipped = feedback_text(job, steps[1])
    messages[-1] = {**messages[-1], "content": messages[-1]["content"].replace(shipped, text)}
    return messages


def shipped(job: Job, record: Record, steps: list[Step]) -> list[dict[str, str]]:
    return build_messages(job, record, "refine", 1, steps)


def findings_first(job: Job, record: Record, steps: list[Step]) -> list[dict[str, str]]:
    return _with_feedback(job, record, steps, _findings_first(job, steps))


def concepts_on_top(job: Job, record: Record, steps: list[Step]) -> list[dict[str, str]]:
    messages = build_messages(job, record, "refine", 1, steps)
    words = ", ".join(str(c) for c in record.fields["concepts"])
    top = (
        "A sentence must describe a realistic scene using every one of these words "
        f"(any form counts): {words}\n\n"
    )
    messages[-1] = {**messages[-1], "content": top + messages[-1]["content"]}
    return messages


def previous(job: Job, record: Record, steps: list[Step]) -> list[dict[str, str]]:
    old = replace(job, refine_prompt=PREVIOUS_REFINE)
    return _with_feedback(old, record, steps, _findings_first(job, steps))


VARIANTS: dict[str, Variant] = {
    "shipped": shipped,
    "findings-first": findings_first,
    "concepts-on-top": concepts_on_top,
    "previous": previous,
}


def load_cases(run_dir: Path, job: Job, limit: int) -> list[Case]:
    manifest = RunDir(run_dir).require_manifest()
    records = {
        r.id: r
        for r in read_records(Path(manifest.input.path), job.inputs, manifest.settings.id_field)
        if isinstance(r, Record)
    }
    cases: list[Case] = []
    with (run_dir / "traces.jsonl").open("rb") as fh:
        for raw in fh:
            line = orjson.loads(raw)
            steps = [Step.from_dict(s) for s in line["steps"][:2]]
            if [s.role for s in steps] == ["generate", "feedback"] and steps[0].checks:
                cases.append((records[line["id"]], steps))
            if len(cases) == limit:
                break
    return cases


def _coverage(job: Job, record: Record, text: str) -> float:
    assert job.evaluator is not None
    return float(job.evaluator(record.fields, text)["coverage"])


async def compare(cases: Sequence[Case], job: Job, model_name: str, names: Sequence[str]) -> None:
    from openai import AsyncOpenAI

    from pipeline.local import LocalServer, resolve_model

    model = await anyio.to_thread.run_sync(resolve_model, model_name)
    async with LocalServer(model) as server:
        client = AsyncOpenAI(base_url=server.base_url, api_key="local", timeout=900)
        print(f"{len(cases)} drafts with check findings, model {server.model}", flush=True)
        print("| variant | before | after | gain (points) | unchanged |\n|---|---|---|---|---|")
        for name in names:
            started = time.monotonic()
            before = after = 0.0
            unchanged = 0
            for record, steps in cases:
                reply = await client.chat.completions.create(
                    model=server.model,
                    messages=VARIANTS[name](job, record, steps),  # type: ignore[arg-type]
                    temperature=job.temperature,
                    max_tokens=job.max_tokens,
                )
                text = (reply.choices[0].message.content or "").strip()
                draft = steps[0].output or ""
                before += _coverage(job, record, draft)
                after += _coverage(job, record, text)
                unchanged += " ".join(text.split()) == " ".join(draft.split())
            n = len(cases)
            gain = 100 * (after - before) / n
            print(
                f"| {name} | {before / n:.3f} | {after / n:.3f} | {gain:+.1f} "
                f"| {unchanged}/{n} |  ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", nargs="?", type=Path, default=RUN_DIR)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--records", type=int, default=20)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    job = load_job("commongen")
    cases = load_cases(args.run_dir, job, args.records)
    if not cases:
        sys.exit(f"{args.run_dir}: no commongen drafts with check findings (run quality.py first)")
    anyio.run(compare, cases, job, args.model, args.variants.split(","))


if __name__ == "__main__":
    main()
