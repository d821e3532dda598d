"""``refine report``: the report directory, written from one pass over the run."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import StoreError
from .aggregate import SAMPLE_SIZE, Summary
from .browser import DETAIL_LIMIT, INDEX_LIMIT, Browser
from .flips import open_flips
from .html import png_uri, render_html
from .markdown import render_markdown
from .plots import figure_class, plot_all
from .source import read_run_info, scan

__all__ = ["ReportFiles", "write_report"]


@dataclass(frozen=True, slots=True)
class ReportFiles:
    """Where the report was written."""

    markdown: Path  # report.md, next to its PNG plots
    html: Path  # index.html: the self-contained page


def write_report(
    run_dir: Path,
    out: Path | None = None,
    *,
    records: Collection[str] | None = None,
    details: int = DETAIL_LIMIT,
    listed: int = INDEX_LIMIT,
) -> ReportFiles:
    """Write ``report.md``, its PNG plots and ``index.html`` into ``out`` (default RUN_DIR/report).

    ``records`` names the records whose iterations the page embeds (default: chosen by
    the browser, at most ``details``); ``listed`` caps the rows of the page's record list.
    Raises ConfigError when matplotlib is missing or ``run_dir`` holds no run, StoreError
    when ``out`` cannot be written.
    """
    figure = figure_class()  # before reading a large run, so a missing extra fails fast
    info = read_run_info(run_dir)
    target = Path(out) if out is not None else info.run_dir / "report"
    summary = Summary(info.pricing, SAMPLE_SIZE)
    flips = open_flips(info)
    better = {name: spec.better for name, spec in flips.specs.items()}
    browser = Browser(
        info.pricing, wanted=records, index_limit=listed, detail_limit=details, better=better
    )
    try:
        found = scan(info, [summary, flips, browser])
        report = replace(summary.report(found), flips=flips.report())
        meta, rows, embedded = browser.finish()
        try:
            target.mkdir(parents=True, exist_ok=True)
            images = plot_all(figure, report, target)
            markdown = target / "report.md"
            markdown.write_text(render_markdown(report, images), encoding="utf-8")
            uris = {key: png_uri(target / name) for key, name in images.items()}
            page = target / "index.html"
            tmp = target / f".index.html.{os.getpid()}.tmp"
            try:
                with tmp.open("wb") as fh:
                    for chunk in render_html(report, uris, meta, rows, embedded):
                        fh.write(chunk)
                os.replace(tmp, page)
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink()
        except OSError as err:
            raise StoreError(f"cannot write the report into {target}: {err.strerror}") from err
    finally:
        browser.close()
    return ReportFiles(markdown, page)
