"""Model ids: who serves a model and its name there, parsed once instead of matched as text.

A run names a model ``NAME`` (served by an OpenAI-compatible endpoint: OpenAI's, or the one
``--base-url`` gives) or ``PROVIDER:NAME`` for a provider refine knows by a prefix:
``local:NAME`` is the embedded llama.cpp model. A colon after anything else is part of the
name (OpenAI's fine-tuned ``ft:gpt-4o-mini:org::id``). The manifest, traces and price files
keep the written form, ``str(model_id)``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["ModelId", "Provider"]


class Provider(enum.Enum):
    """Who serves a model; the value is the prefix that names it (none for endpoints)."""

    ENDPOINT = ""  # an OpenAI-compatible endpoint: OpenAI's, or --base-url's
    LOCAL = "local"  # the embedded llama.cpp model, served for the run: free, no service tiers


_BY_PREFIX = {p.value: p for p in Provider if p.value}


@dataclass(frozen=True, slots=True)
class ModelId:
    """A model as a run names it: its provider and its name there."""

    name: str  # "": the provider's default model (``--feedback-model local``)
    provider: Provider = Provider.ENDPOINT

    @classmethod
    def parse(cls, text: str) -> ModelId:
        """The id ``text`` writes: ``PROVIDER:NAME`` for a known prefix, else a plain name."""
        head, _, tail = text.partition(":")
        provider = _BY_PREFIX.get(head)
        return cls(text) if provider is None else cls(tail, provider)

    @classmethod
    def local(cls, name: str) -> ModelId:
        """The embedded model ``name``."""
        return cls(name, Provider.LOCAL)

    @property
    def is_local(self) -> bool:
        """Whether the embedded llama.cpp model serves it (free, no service tiers)."""
        return self.provider is Provider.LOCAL

    def __str__(self) -> str:
        prefix = self.provider.value
        if not prefix:
            return self.name
        return f"{prefix}:{self.name}" if self.name else prefix
