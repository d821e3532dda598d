"""The report as one self-contained HTML page: the overview, and a record browser.

Styles, script, plots (PNG as ``data:`` URIs) and records (JSON in ``<script
type="application/json">`` elements) are all inside the file, and its
Content-Security-Policy forbids every network request, so the page opens from disk
anywhere and never phones home. The page is written piece by piece: the records'
JSON is copied from the browser's temporary files in chunks.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Final

import orjson

from .aggregate import RunReport
from .document import Block, Bullets, Heading, Image, Para, Table, Text, Verbatim, build

__all__ = ["CSP", "png_uri", "render_html"]

# Nothing may be fetched: no script, style, font, image or connection from anywhere.
CSP: Final = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
    "script-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
)


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _inline(text: Text) -> str:
    parts = text if isinstance(text, tuple) else (text,)
    return "".join(
        f"<code>{html.escape(p.text)}</code>" if isinstance(p, Verbatim) else html.escape(p)
        for p in parts
    )


def _numeric(text: Text) -> bool:
    """Whether a cell holds a figure (right-aligned): it starts with a digit, sign or dollar."""
    return isinstance(text, str) and text[:1] in set("0123456789+-$")


def _block(block: Block, images: Mapping[str, str]) -> str:
    match block:
        case Heading(level, text, anchor):
            ident = f' id="{html.escape(anchor)}"' if anchor else ""
            return f"<h{level}{ident}>{_inline(text)}</h{level}>"
        case Para(text):
            return f'<p class="note">{_inline(text)}</p>'
        case Bullets(items):
            return "<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>"
        case Table(header, rows):
            head = "".join(f"<th>{_inline(h)}</th>" for h in header)
            figures = any(header)  # a table without a header is a list of facts, not of figures
            body = "".join(
                "<tr>"
                + "".join(
                    f'<td class="num">{_inline(c)}</td>'
                    if figures and _numeric(c)
                    else f"<td>{_inline(c)}</td>"
                    for c in row
                )
                + "</tr>"
                for row in rows
            )
            thead = f"<thead><tr>{head}</tr></thead>" if figures else ""
            return f"<table>{thead}<tbody>{body}</tbody></table>"
        case Image(key, alt):
            if key not in images:
                return ""
            return f'<img class="plot" alt="{html.escape(alt)}" src="{images[key]}">'
    raise AssertionError(block)  # pragma: no cover - every block type is matched above


def png_uri(path: Path) -> str:
    """A PNG file as a ``data:`` URI."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _limits(meta: Mapping[str, Any], run_dir: str) -> str:
    """What the page holds of a large run, and how to see the rest."""
    total, listed, detailed = meta["total"], meta["listed"], meta["detailed"]
    out = [
        f"{total:,} finished records; {listed:,} listed below (filter, search and sort them); "
        f"{detailed:,} with their iterations embedded (click a row)."
    ]
    if listed < total:
        out.append(
            f"The list holds at most {meta['index_limit']:,} records: the first of "
            "outputs.jsonl, plus every embedded one. The others count in the overview only."
        )
    if meta["selection"] == "chosen":
        main = meta["main"]
        by = f" by {meta['measures'][main]['label']}" if main is not None else ""
        out.append(
            f"Iterations are embedded for at most {meta['detail_limit']:,} records: the failed "
            f"ones, then{by} the most improved, the most worsened and the lowest final values, "
            "then the first in file order. To see particular records, put their ids in a file "
            f"(one per line) and run <code>refine report {html.escape(run_dir)} --records "
            "FILE</code>; <code>--details N</code> embeds more."
        )
    elif meta["selection"] == "asked":
        out.append(
            f"Iterations are embedded for the records asked for with <code>--records</code> "
            f"({meta['asked']:,} ids asked, {detailed:,} found; at most "
            f"{meta['detail_limit']:,})."
        )
    return " ".join(out)


def _json_script(ident: str, chunks: Iterable[bytes]) -> Iterator[bytes]:
    yield f'<script type="application/json" id="{ident}">'.encode()
    for chunk in chunks:
        # "<" only occurs inside JSON strings, where \u003c means the same character and
        # cannot close the script element early.
        yield chunk.replace(b"<", b"\\u003c")
    yield b"</script>\n"


def render_html(
    report: RunReport,
    images: Mapping[str, str],
    meta: Mapping[str, Any],
    rows: Iterable[bytes],
    details: Iterable[bytes],
) -> Iterator[bytes]:
    """The page, in chunks; ``images`` maps plot keys to ``data:`` URIs."""
    title = html.escape(f"Run report: {report.run.job}")
    overview = "\n".join(_block(b, images) for b in build(report)[1:])  # the title is the bar
    yield f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="referrer" content="no-referrer">
<title>{title}</title>
<style>
{_asset("page.css")}
</style>
</head>
<body>
<header class="top">
<h1>{title}</h1>
<nav class="tabs">
<a href="#overview" data-tab="overview" class="active">Overview</a>
<a href="#records" data-tab="records">Records ({meta["total"]:,})</a>
</nav>
</header>
<main>
<section class="tab" id="overview">
{overview}
</section>
<section class="tab" id="records">
<h2>Records</h2>
<p class="note">{_limits(meta, str(report.run.run_dir))}</p>
<noscript><p>The record browser needs JavaScript; the overview does not.</p></noscript>
<div class="controls">
<label>search id<input type="search" id="f-search" placeholder="part of an id"></label>
<label>status<select id="f-status"><option value="">any</option></select></label>
<label>stop reason<select id="f-stop"><option value="">any</option></select></label>
<label>measure<select id="f-measure"><option value="-1">none</option></select></label>
<label>initial → chosen<select id="f-change">
<option value="">any</option><option value="improved">improved</option>
<option value="worsened">worsened</option><option value="unchanged">unchanged</option>
<option value="value">has a value</option><option value="none">no value</option>
</select></label>
<label>round<select id="f-round"><option value="">any</option></select></label>
<label class="check"><input type="checkbox" id="f-embedded">with iterations only</label>
</div>
<div class="note" id="record-count"></div>
<table id="record-list"></table>
<div class="pager" id="pager"></div>
<div id="record"></div>
</section>
</main>
""".encode()
    yield from _json_script("report-meta", [orjson.dumps(meta)])
    yield from _json_script("report-rows", rows)
    yield from _json_script("report-details", details)
    yield f"<script>\n{_asset('page.js')}</script>\n</body>\n</html>\n".encode()
