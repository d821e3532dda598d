"""Resolving --local-model: registered names, .gguf paths, and the provenance recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.serving import LocalModel, UnknownModelError, resolve_model
from pipeline.serving.resolve import package_origin

from .fakes import FakeDownloader, build_wheels, chunks, quiet, spec_for


def test_second_resolve_uses_cache_without_downloading(tmp_path: Path) -> None:
    """A registered model already in the cache is resolved without calling the downloader."""
    parts = chunks()
    build_wheels(tmp_path / "wheels", parts)
    spec = spec_for(tmp_path, parts)
    fetch = FakeDownloader(tmp_path / "wheels")
    registry = {spec.name: spec}
    cache = tmp_path / "cache"
    first = resolve_model(
        "fake-model", cache_dir=cache, downloader=fetch, registry=registry, log=quiet
    )
    second = resolve_model(
        "fake-model", cache_dir=cache, downloader=fetch, registry=registry, log=quiet
    )
    assert fetch.calls == 1
    assert first == second
    assert (first.name, first.path, first.sha256) == (
        "fake-model",
        cache / "fake-model.gguf",
        spec.sha256,
    )
    assert first.provenance() == {
        "name": "fake-model",
        "source": "packages",
        "origin": "pypi:fake-model-part{1..1}==1.0",
        "file": "fake-model.gguf",
        "sha256": spec.sha256,
    }


def test_resolve_unknown_name_lists_known_models(tmp_path: Path) -> None:
    """An unknown name raises UnknownModelError (a ValueError) naming the known models."""
    with pytest.raises(UnknownModelError, match=r"qwen2\.5-coder-0\.5b") as caught:
        resolve_model("llama-70b", cache_dir=tmp_path, log=quiet)
    assert isinstance(caught.value, ValueError)
    assert "qwen2.5-coder-1.5b" in str(caught.value)
    assert "hf:OWNER/NAME/FILE.gguf" in str(caught.value)


def test_resolve_missing_gguf_path(tmp_path: Path) -> None:
    """A .gguf path that does not exist raises UnknownModelError."""
    with pytest.raises(UnknownModelError, match="no such model file"):
        resolve_model(str(tmp_path / "absent.gguf"), cache_dir=tmp_path, log=quiet)


def test_resolve_rejects_non_gguf_files(tmp_path: Path) -> None:
    """Existing files without the .gguf suffix or the GGUF header are refused."""
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"NOPE" + bytes(16))
    with pytest.raises(UnknownModelError, match=r"not a \.gguf file"):
        resolve_model(str(text), cache_dir=tmp_path, log=quiet)
    with pytest.raises(UnknownModelError, match="bad header"):
        resolve_model(str(fake), cache_dir=tmp_path, log=quiet)
    with pytest.raises(UnknownModelError, match="not a file"):
        resolve_model(str(tmp_path), cache_dir=tmp_path, log=quiet)


def test_resolve_user_gguf_path_is_used_as_is(tmp_path: Path) -> None:
    """An existing GGUF file is returned as is, named by its stem, with no checksum."""
    model = tmp_path / "my-model.Q4.gguf"
    model.write_bytes(b"GGUF" + bytes(16))
    resolved = resolve_model(str(model), cache_dir=tmp_path / "cache", log=quiet)
    assert resolved == LocalModel("my-model.Q4", model.resolve(), None)
    assert resolved.provenance()["source"] == "file"
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("requirements", "origin"),
    [
        ("# c\na-part1==0.9 --hash=sha256:x\na-part2==0.9", "pypi:a-part{1..2}==0.9"),
        ("b-2-part1==1.0 --hash=sha256:x\n", "pypi:b-2-part{1..1}==1.0"),
        ("a-part1==1 --hash=sha256:x\nc-part2==1 --hash=sha256:y\n", "pypi:a-part1==1,c-part2==1"),
        ("# nothing pinned\n", "pypi"),
    ],
)
def test_package_origin(requirements: str, origin: str) -> None:
    """The manifest names the package set a registered model came from, compactly."""
    assert package_origin(requirements) == origin
