"""GGUF files from the Hugging Face hub: ``--local-model hf:OWNER/NAME[@REVISION]/FILE.gguf``.

Downloads go through ``huggingface_hub`` (the ``hf`` extra) into its own cache, so a
file fetched by other tools is reused and ``HF_ENDPOINT``, ``HF_HOME``/``HF_HUB_CACHE``
and ``HF_TOKEN`` work as they do elsewhere. A fresh download is hashed and checked
against the SHA-256 the hub names it by; later runs read that name instead of hashing.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path

from ..errors import ModelFetchError, ModelIntegrityError, UnknownModelError
from ._messages import log_stderr
from .registry import HubFile

__all__ = ["HUB_PREFIX", "fetch_hub_file", "format_hub_ref", "parse_hub_ref"]

HUB_PREFIX = "hf:"
HUB_HINT = "pip install 'refine[hf]'"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 8 * 1024 * 1024
_FORM = "hf:OWNER/NAME/FILE.gguf or hf:OWNER/NAME@REVISION/FILE.gguf"


def parse_hub_ref(text: str) -> HubFile:
    """``hf:OWNER/NAME[@REVISION]/PATH.gguf`` as a HubFile; UnknownModelError when malformed."""
    body = text.strip().removeprefix(HUB_PREFIX)
    owner, _, rest = body.partition("/")
    repo_part, _, filename = rest.partition("/")
    name, _, revision = repo_part.partition("@")
    segments = filename.split("/")
    if not (_NAME.match(owner) and _NAME.match(name)) or not filename:
        raise UnknownModelError(f"{text!r} is not a hub reference; expected {_FORM}")
    if "@" in repo_part and not _REVISION.match(revision):
        raise UnknownModelError(f"{text!r}: {revision!r} is not a revision")
    if any(part in ("", ".", "..") for part in segments):
        raise UnknownModelError(f"{text!r}: {filename!r} is not a file path in the repository")
    if not filename.lower().endswith(".gguf"):
        raise UnknownModelError(f"{text!r} does not name a .gguf file; expected {_FORM}")
    return HubFile(f"{owner}/{name}", filename, revision or None)


def format_hub_ref(ref: HubFile) -> str:
    """The ``hf:`` reference that :func:`parse_hub_ref` reads back as ``ref``."""
    revision = f"@{ref.revision}" if ref.revision else ""
    return f"{HUB_PREFIX}{ref.repo}{revision}/{ref.filename}"


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_hub_file(
    ref: HubFile,
    *,
    cache_dir: Path | None = None,
    endpoint: str | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[Path, str]:
    """Download ``ref`` (or find it in the hub cache); return its path and SHA-256."""
    say = log if log is not None else log_stderr
    try:
        import huggingface_hub
        from huggingface_hub import errors as hub_errors
    except ImportError as err:
        raise ModelFetchError(
            f"{format_hub_ref(ref)} needs huggingface_hub; install it with: {HUB_HINT}"
        ) from err
    # Read at call time: huggingface_hub reads HF_ENDPOINT once, when first imported.
    where = endpoint or os.environ.get("HF_ENDPOINT") or None
    cached = huggingface_hub.try_to_load_from_cache(
        ref.repo, ref.filename, cache_dir=cache_dir, revision=ref.revision
    )
    if not isinstance(cached, str):
        say(f"downloading {format_hub_ref(ref)} from {where or 'the Hugging Face hub'}")
    try:
        local = huggingface_hub.hf_hub_download(
            ref.repo, ref.filename, revision=ref.revision, cache_dir=cache_dir, endpoint=where
        )
    except hub_errors.LocalEntryNotFoundError as err:
        # The hub did not answer and the cache does not hold the file.
        raise ModelFetchError(f"cannot download {format_hub_ref(ref)}: {err}") from err
    except (
        hub_errors.RepositoryNotFoundError,
        hub_errors.RevisionNotFoundError,
        hub_errors.EntryNotFoundError,
    ) as err:
        raise UnknownModelError(f"{format_hub_ref(ref)} is not on the hub: {err}") from err
    except (hub_errors.HfHubHTTPError, OSError, ValueError) as err:
        raise ModelFetchError(f"cannot download {format_hub_ref(ref)}: {err}") from err
    blob = Path(local).resolve()
    # The hub's cache names a large file's blob by the SHA-256 the hub published for it.
    named = blob.name if _SHA256.match(blob.name) else None
    if named is not None and isinstance(cached, str):
        return Path(local), named
    digest = _sha256_of(blob)
    if named is not None and digest != named:
        blob.unlink(missing_ok=True)
        raise ModelIntegrityError(
            f"{format_hub_ref(ref)} arrived with sha256 {digest}, not the {named} the hub "
            "published; the download was removed"
        )
    return Path(local), digest
