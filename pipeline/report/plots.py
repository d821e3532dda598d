"""The report's plots, drawn with matplotlib as PNG files.

matplotlib is imported only when plots are drawn, so ``import pipeline`` never needs it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ..errors import ConfigError
from .aggregate import Distribution, Measure, RunReport

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure

__all__ = ["INSTALL_HINT", "figure_class", "plot_all"]

INSTALL_HINT: Final = "pip install 'refine[report]'"
DPI: Final = 100
FIGSIZE: Final = (6.4, 3.6)


# -- plots -------------------------------------------------------------------------------------


def figure_class() -> type[Figure]:
    """matplotlib's Figure class (ConfigError naming the extra to install when it is missing)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ConfigError(f"refine report draws its plots with matplotlib: {INSTALL_HINT}") from err
    return Figure


def _plain(text: str) -> str:
    # `$` starts matplotlib's mathtext: a metric named "cost_$" must print as written.
    return text.replace("$", r"\$")


def _save(fig: Figure, path: Path) -> None:
    # A bare Figure (no pyplot) draws PNG with the Agg canvas and never touches the global
    # backend, so reports can be written from notebooks, threads and servers alike.
    fig.savefig(path, format="png", dpi=DPI)


def _whole_numbers(axis: Axis) -> None:
    """Ticks at whole numbers only: the axis counts records."""
    from matplotlib.ticker import MaxNLocator  # matplotlib is known to be there by now

    axis.set_major_locator(MaxNLocator(integer=True))


def _new(figure: type[Figure]) -> tuple[Figure, Axes]:
    fig = figure(figsize=FIGSIZE, layout="constrained")
    return fig, fig.add_subplot()


def _plot_measure(figure: type[Figure], m: Measure, rows: int, path: Path) -> None:
    fig, ax = _new(figure)
    ts = list(range(rows))
    scale = 100.0 if m.rate else 1.0
    for cells, style, label in (
        (m.carried, "-o", "carried forward (every record)"),
        (m.reached, "--s", "reached t only"),
    ):
        xs = [t for t in ts if cells[t].mean is not None]
        ys = [(cells[t].mean or 0.0) * scale for t in xs]
        ax.plot(xs, ys, style, label=label)
    ax.set_xticks(ts)
    ax.set_xlabel("t (refinements)")
    ax.set_ylabel(_plain(f"{m.name} (% true)" if m.rate else m.name))
    ax.set_title(_plain(f"{m.label} by iteration"))
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, path)


def _plot_stop_reasons(figure: type[Figure], reasons: Mapping[str, int], path: Path) -> None:
    fig, ax = _new(figure)
    names = list(reasons)[::-1]  # most frequent on top
    bars = ax.barh(names, [reasons[n] for n in names])
    ax.bar_label(bars, padding=2)
    _whole_numbers(ax.xaxis)
    ax.set_xlabel("records")
    ax.set_title("Stop reasons")
    ax.margins(x=0.15)
    _save(fig, path)


def _plot_iterations(
    figure: type[Figure], made: Mapping[int, int], chosen: Mapping[int, int], path: Path
) -> None:
    fig, ax = _new(figure)
    ts = list(range(max(max(made), max(chosen, default=0)) + 1))
    width = 0.4
    ax.bar(
        [t - width / 2 for t in ts], [made.get(t, 0) for t in ts], width, label="refinements made"
    )
    ax.bar(
        [t + width / 2 for t in ts], [chosen.get(t, 0) for t in ts], width, label="chosen iteration"
    )
    ax.set_xticks(ts)
    ax.set_xlabel("t")
    _whole_numbers(ax.yaxis)
    ax.set_ylabel("done records")
    ax.set_title("Refinements made and iteration chosen, per record")
    ax.legend()
    _save(fig, path)


def _plot_tokens(figure: type[Figure], tokens: Distribution, path: Path) -> None:
    fig, ax = _new(figure)
    ax.hist(tokens.sample, bins=min(40, max(1, len(set(tokens.sample)))))
    ax.set_xlabel("prompt + completion tokens")
    _whole_numbers(ax.yaxis)
    ax.set_ylabel("records" if tokens.count == len(tokens.sample) else "records (sample)")
    ax.set_title("Tokens per record")
    _save(fig, path)


def _plot_latency(figure: type[Figure], latency: Mapping[str, Distribution], path: Path) -> None:
    fig, ax = _new(figure)
    roles = list(latency)
    ax.boxplot([list(latency[r].sample) for r in roles])
    ax.set_xticks(range(1, len(roles) + 1), roles)
    lows = [d.min for d in latency.values() if d.min is not None]
    highs = [d.max for d in latency.values() if d.max is not None]
    # Latencies are long-tailed: a log axis keeps the boxes readable next to the outliers.
    if lows and min(lows) > 0 and max(highs) / min(lows) >= 50:
        ax.set_yscale("log")
    ax.set_ylabel("seconds per call")
    ax.set_title("Call latency by role")
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "metric"


def plot_all(figure: type[Figure], r: RunReport, out: Path) -> dict[str, str]:
    """Draw every plot that has data into ``out``; map plot keys to file names."""
    names: dict[str, str] = {}
    used: set[str] = set()

    def name(key: str, stem: str) -> Path:
        base, n = stem, 2
        while stem in used:
            stem, n = f"{base}-{n}", n + 1
        used.add(stem)
        names[key] = f"{stem}.png"
        return out / names[key]

    if r.done:
        for i, m in enumerate(r.measures):
            stem = (
                "by-iteration-score" if m.measured == "score" else f"by-iteration-{_slug(m.name)}"
            )
            _plot_measure(figure, m, r.rows, name(f"measure-{i}", stem))
        _plot_iterations(
            figure, r.iterations, r.chosen_iterations, name("iterations", "iterations")
        )
    if r.stop_reasons:
        _plot_stop_reasons(figure, r.stop_reasons, name("stop_reasons", "stop-reasons"))
    if r.tokens.count:
        _plot_tokens(figure, r.tokens, name("tokens", "tokens-per-record"))
    if r.latency:
        _plot_latency(figure, r.latency, name("latency", "latency-by-role"))
    return names
