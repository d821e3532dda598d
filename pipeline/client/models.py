"""Model ids: who serves a model and its name there, parsed once instead of matched as text.

A run names a model ``NAME`` (served by an OpenAI-compatible endpoint: OpenAI's, or the one
``--base-url`` gives) or ``PROVIDER:NAME`` for a provider refine knows by a prefix:
``local:NAME`` is the embedded llama.cpp model, ``anthropic:NAME`` a Claude model over
Anthropic's own Messages API (``anthropic:claude-sonnet-4-6``). A colon after anything else
is part of the name (OpenAI's fine-tuned ``ft:gpt-4o-mini:org::id``). The manifest, traces
and price files keep the written form, ``str(model_id)``; requests carry ``name``.

Each provider's facts a run needs before it opens a client (where its key and its base URL
come from, and its default URL) are the provider's properties, so nothing else asks which
provider it has.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["ANTHROPIC_URL", "OPENAI_URL", "ModelId", "Provider"]

OPENAI_URL = "https://api.openai.com/v1"  # where the openai SDK sends calls given no URL
ANTHROPIC_URL = "https://api.anthropic.com"  # the root of Anthropic's API (paths start /v1)


class Provider(enum.Enum):
    """Who serves a model; the value is the prefix that names it (none for endpoints)."""

    ENDPOINT = ""  # an OpenAI-compatible endpoint: OpenAI's, or --base-url's
    LOCAL = "local"  # the embedded llama.cpp model, served for the run: free, no service tiers
    ANTHROPIC = "anthropic"  # Anthropic's Messages API and Message Batches

    @property
    def key_env(self) -> str | None:
        """The environment variable its API key is read from (None: it needs none)."""
        return _KEY_ENV[self]

    @property
    def url_env(self) -> str | None:
        """The environment variable a new run takes its base URL from, when given none."""
        return _URL_ENV[self]

    @property
    def writes_cache(self) -> bool:
        """Whether its prompt cache is written on request, at a price of its own (Anthropic's
        breakpoints); others cache on their own and bill nothing for it."""
        return self is Provider.ANTHROPIC

    @property
    def default_url(self) -> str | None:
        """Where its calls go when no URL is given (None: the provider has no public one)."""
        return _DEFAULT_URL[self]


_KEY_ENV = {
    Provider.ENDPOINT: "OPENAI_API_KEY",
    Provider.LOCAL: None,
    Provider.ANTHROPIC: "ANTHROPIC_API_KEY",
}
_URL_ENV = {
    Provider.ENDPOINT: "OPENAI_BASE_URL",
    Provider.LOCAL: None,
    Provider.ANTHROPIC: "ANTHROPIC_BASE_URL",
}
_DEFAULT_URL = {
    Provider.ENDPOINT: OPENAI_URL,
    Provider.LOCAL: None,
    Provider.ANTHROPIC: ANTHROPIC_URL,
}
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
