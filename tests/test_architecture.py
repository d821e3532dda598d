"""The package's shape: layers import downward only, no cycles, small modules, a job-free core."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import pipeline

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500
# Each layer may import the layers listed after it (and itself), never one before it.
LAYERS = (
    "cli",
    "commands",
    "report",
    "runner",
    "backends",
    "serving",
    "runs",
    "io",
    "client",
    "sandbox",
    "core",
    "errors",
)


def modules() -> dict[str, Path]:
    """Every module of pipeline/ and jobs/, by dotted name."""
    found = {}
    for base in ("pipeline", "jobs"):
        for path in (ROOT / base).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = modules()


def imports(name: str) -> Iterator[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import in module ``name``."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [a.name for a in node.names]
            for n in names:  # ``from pkg import module``
                if f"{target}.{n}" in MODULES:
                    yield f"{target}.{n}", []
            yield target, names
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []


def graph() -> dict[str, set[str]]:
    return {name: {t for t, _ in imports(name) if t in MODULES and t != name} for name in MODULES}


def layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "pipeline" and len(parts) > 1 else None


def test_no_import_cycles() -> None:
    """No module reaches itself through its imports (lazy imports included)."""
    edges = graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_small(name: str) -> None:
    """No module of the package or the jobs holds more than 500 lines."""
    assert len(MODULES[name].read_text().splitlines()) <= MAX_LINES


def test_layers_import_only_layers_below() -> None:
    """A layer imports only the layers under it in the map (docs/architecture.md)."""
    wrong = []
    for name, targets in graph().items():
        mine = layer(name)
        if mine not in LAYERS:
            continue
        for target in targets:
            theirs = layer(target)
            if theirs in LAYERS and LAYERS.index(theirs) < LAYERS.index(mine):
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_the_core_knows_no_job_no_sandbox_and_no_run() -> None:
    """The Self-Refine fold imports nothing but itself and the error tree: no code
    parsing, no sandbox, no HTTP client, no run directory."""
    for name in (n for n in MODULES if n.startswith("pipeline.core")):
        for target, _ in imports(name):
            if target.startswith(("pipeline", "jobs")):
                assert target.startswith(("pipeline.core", "pipeline.errors")), (name, target)


def test_no_private_name_crosses_a_package() -> None:
    """A name starting with an underscore is only imported within its own package."""
    crossing = []
    for name in MODULES:
        home = name.rpartition(".")[0]
        for target, names in imports(name):
            if target not in MODULES:
                continue
            there = target if MODULES[target].name == "__init__.py" else target.rpartition(".")[0]
            for n in names:
                if n.startswith("_") and not n.startswith("__") and not home.startswith(there):
                    crossing.append(f"{name}: {target}.{n}")
    assert crossing == []


def test_the_maps_list_the_layers_in_this_order() -> None:
    """The package docstring's map and docs/architecture.md (its picture and its list)
    name the layers in the order this test enforces."""
    doc = pipeline.__doc__ or ""
    in_docstring = [m.group(1) for m in re.finditer(r"^    (\w+) ", doc, re.MULTILINE)]
    page = (ROOT / "docs" / "architecture.md").read_text()
    picture = page[page.index("```") : page.index("```", page.index("```") + 3)]
    in_picture = [m.group(1) for m in re.finditer(r"│ (\w+)(?:/|\.py) ", picture)]
    listed = re.search(r"`pipeline/__init__.py`: ([a-z,\s]+?) \(", page)
    assert listed is not None
    in_list = [name.strip() for name in listed.group(1).split(",")]
    assert in_docstring == in_picture == in_list == list(LAYERS)
