"""``refine merge OUT_DIR RUN_DIR...``: the run directories of ``--shard I/N`` runs as one run.

Shards of one run read the same input with the same job, models and settings, and each
keeps the records whose id hashes to its index, so their outputs and traces are disjoint
and their union is the whole run. The merge checks exactly that, and refuses:

- a directory that is not a shard run, or is still running;
- mismatched shards: another job (name or content), model, critic, identity setting,
  ``--limit``, input fingerprint or shard count N;
- overlapping shards: the same index twice, or one record id in two directories;
- missing or unfinished shards, unless ``partial`` (then what they hold is merged, the
  journals too, and ``refine resume OUT_DIR`` runs the rest).

OUT_DIR gets outputs.jsonl and traces.jsonl (each shard's in turn), errors.jsonl (every
shard reads the whole input and reports the same unreadable lines: one per line), the
shards' checkpoint journals, and a manifest of the whole run, so ``refine status``,
``refine report`` and the rest read it like any run directory.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import orjson

from ..errors import ConfigError, RunDirError, StoreError
from ..runs.manifest import Manifest, now_iso
from ..runs.rundir import RunDir

__all__ = ["MergeSummary", "describe", "merge"]

_OUT_FILES = ("manifest.json", "outputs.jsonl", "traces.jsonl", "errors.jsonl", "checkpoint.jsonl")


@dataclass(frozen=True, slots=True)
class MergeSummary:
    """What a merge wrote."""

    out_dir: Path
    shards: tuple[int, ...]  # the shard indexes merged
    count: int  # N
    done: int
    failed: int
    bad_lines: int
    complete: bool  # every shard present and finished

    @property
    def exit_code(self) -> int:
        """The status a run with these records would exit with: 0, or 1 (failed, unreadable)."""
        return 0 if self.complete and not self.failed and not self.bad_lines else 1


@dataclass(frozen=True, slots=True)
class _Shard:
    rd: RunDir
    manifest: Manifest
    index: int
    count: int


def _match(manifest: Manifest) -> dict[str, Any]:
    """What every shard of one run has in common."""
    ident = {k: v for k, v in manifest.identity().items() if k != "shard"}
    ident["limit"] = manifest.settings.limit
    ident["input fingerprint"] = manifest.input.fingerprint
    return ident


def _shards(run_dirs: Sequence[Path], partial: bool) -> list[_Shard]:
    shards: list[_Shard] = []
    for path in run_dirs:
        rd = RunDir(Path(path))
        manifest = rd.require_manifest()
        if manifest.settings.shard is None:
            raise ConfigError(f"{path} is not a shard run (it was not run with --shard I/N)")
        if rd.is_locked():
            raise ConfigError(f"{path} is still running; merge it once it has finished")
        index, count = manifest.settings.shard
        if manifest.state != "finished" and not partial:
            raise ConfigError(
                f"{path} (shard {index}/{count}) has not finished (state: {manifest.state}); "
                "run its command again, or merge what there is with --partial"
            )
        shards.append(_Shard(rd, manifest, index, count))
    if not shards:
        raise ConfigError("no run directories to merge")
    first = shards[0]
    expect = _match(first.manifest)
    seen: dict[int, Path] = {}
    for s in shards:
        if s.count != first.count:
            raise RunDirError(
                f"{s.rd.path} is shard {s.index}/{s.count}, not one of {first.count} "
                f"like {first.rd.path}"
            )
        for key, value in _match(s.manifest).items():
            if value != expect[key]:
                raise RunDirError(
                    f"{s.rd.path} is not a shard of the run in {first.rd.path}: "
                    f"{key} is {value!r}, not {expect[key]!r}"
                )
        if s.index in seen:
            raise RunDirError(f"{s.rd.path} and {seen[s.index]} are both shard {s.index}")
        seen[s.index] = s.rd.path
    missing = sorted(set(range(first.count)) - set(seen))
    if missing and not partial:
        raise ConfigError(
            f"shard(s) {', '.join(str(i) for i in missing)} of {first.count} are missing; "
            "merge what there is with --partial"
        )
    return sorted(shards, key=lambda s: s.index)


def _lines(path: Path) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """The complete JSON lines of a file (a torn last line is left out)."""
    if not path.exists():
        return
    with path.open("rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                return
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                yield raw, obj


def _refuse_used(out: RunDir) -> None:
    for name in _OUT_FILES:
        if (out.path / name).exists():
            raise ConfigError(f"{out.path} already holds {name}; merge into a new directory")


def merge(
    out_dir: str | Path, run_dirs: Sequence[str | Path], *, partial: bool = False
) -> MergeSummary:
    """Merge the run directories of a sharded run into ``out_dir`` (new or empty)."""
    shards = _shards([Path(p) for p in run_dirs], partial)
    out = RunDir(Path(out_dir))
    _refuse_used(out)
    # Files are written under temporary names and renamed once all is well: a refused or
    # failed merge leaves OUT_DIR as it found it.
    staged = RunDir(out.path / ".merging")
    try:
        shutil.rmtree(staged.path, ignore_errors=True)
        staged.path.mkdir(parents=True)
        summary = _write(staged, shards, partial)
        for name in _OUT_FILES:
            os.replace(staged.path / name, out.path / name)
    except OSError as err:
        raise StoreError(f"cannot write {out.path}: {err.strerror}") from err
    finally:
        shutil.rmtree(staged.path, ignore_errors=True)
    return replace(summary, out_dir=out.path)


def _write(out: RunDir, shards: list[_Shard], partial: bool) -> MergeSummary:
    owner: dict[str, Path] = {}  # record id -> the shard it came from
    done = failed = 0
    with out.outputs_path.open("wb") as fh:
        for s in shards:
            for raw, obj in _lines(s.rd.outputs_path):
                rid = str(obj.get("id"))
                if rid in owner:
                    if owner[rid] == s.rd.path:
                        continue  # a line written twice by an interrupted run
                    raise RunDirError(
                        f"record {rid!r} is in both {owner[rid]} and {s.rd.path}: "
                        "the shards overlap"
                    )
                owner[rid] = s.rd.path
                fh.write(raw)
                if obj.get("status") == "failed":
                    failed += 1
                else:
                    done += 1
        _sync(fh)
    with out.traces_path.open("wb") as fh:
        written: set[str] = set()
        for s in shards:
            for raw, obj in _lines(s.rd.traces_path):
                rid = str(obj.get("id"))
                if owner.get(rid) == s.rd.path and rid not in written:
                    written.add(rid)
                    fh.write(raw)
        _sync(fh)
    bad: set[Any] = set()
    with out.errors_path.open("wb") as fh:
        for s in shards:
            for raw, obj in _lines(s.rd.errors_path):
                if obj.get("line") not in bad:
                    bad.add(obj.get("line"))
                    fh.write(raw)
        _sync(fh)
    with out.journal_path.open("wb") as fh:
        for s in shards:
            for raw, _ in _lines(s.rd.journal_path):
                fh.write(raw)
        _sync(fh)
    complete = not partial or (
        len(shards) == shards[0].count and all(s.manifest.state == "finished" for s in shards)
    )
    summary = MergeSummary(
        out.path,
        tuple(s.index for s in shards),
        shards[0].count,
        done,
        failed,
        len(bad),
        complete,
    )
    first = shards[0].manifest
    manifest = replace(
        first,
        settings=replace(first.settings, shard=None),
        created_at=min(s.manifest.created_at for s in shards),
        updated_at=now_iso(),
        runs=sum(s.manifest.runs for s in shards),
        state="finished" if complete else "partial",
        exit_code=summary.exit_code if complete else None,
    )
    out.write_manifest(manifest)
    return summary


def _sync(fh: IO[bytes]) -> None:
    fh.flush()
    os.fsync(fh.fileno())


def describe(summary: MergeSummary) -> str:
    """One line for people."""
    shards = ", ".join(str(i) for i in summary.shards)
    scope = "" if summary.complete else " (partial: `refine resume` the directory for the rest)"
    return (
        f"merged shard(s) {shards} of {summary.count} into {summary.out_dir}: "
        f"{summary.done} done, {summary.failed} failed, {summary.bad_lines} unreadable "
        f"input line(s){scope}"
    )
