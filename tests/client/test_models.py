"""Model ids parsed into a provider and a name, never matched by prefix where they are used."""

from __future__ import annotations

import pytest

from pipeline.client.models import ModelId, Provider
from pipeline.client.prices import LOCAL, PriceBook
from pipeline.runs.settings import Settings


@pytest.mark.parametrize(
    ("text", "name", "provider"),
    [
        ("gpt-4o-mini", "gpt-4o-mini", Provider.ENDPOINT),
        ("local:qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b", Provider.LOCAL),
        ("local", "", Provider.LOCAL),
        ("ft:gpt-4o-mini:acme::abc123", "ft:gpt-4o-mini:acme::abc123", Provider.ENDPOINT),
        ("localhost-model", "localhost-model", Provider.ENDPOINT),
        ("Qwen/Qwen2.5-7B:q4", "Qwen/Qwen2.5-7B:q4", Provider.ENDPOINT),
    ],
)
def test_parse_reads_a_known_prefix_only_and_writes_the_same_text(
    text: str, name: str, provider: Provider
) -> None:
    """A known prefix names the provider, any other colon is the name's; str gives the text."""
    parsed = ModelId.parse(text)
    assert (parsed.name, parsed.provider) == (name, provider)
    assert str(parsed) == text


def test_the_embedded_model_is_local_and_free() -> None:
    """``ModelId.local`` writes ``local:NAME``; prices take any local model as free."""
    model = ModelId.local("tiny")
    assert str(model) == "local:tiny" and model.is_local
    assert not ModelId.parse("gpt-4o-mini").is_local
    assert PriceBook().price(str(model)) is LOCAL
    assert PriceBook().price("localhost-model") is None


@pytest.mark.parametrize(
    ("feedback_model", "is_local", "name"),
    [
        (None, False, None),
        ("gpt-4o", False, None),
        ("local", True, None),
        ("local:qwen2.5-coder-1.5b", True, "qwen2.5-coder-1.5b"),
        ("localhost-model", False, None),
    ],
)
def test_settings_find_a_local_critic_by_its_parsed_id(
    feedback_model: str | None, is_local: bool, name: str | None
) -> None:
    """--feedback-model local[:NAME] is the embedded critic; other names are endpoints'."""
    settings = Settings(feedback_model=feedback_model)
    assert settings.critic_is_local is is_local
    assert settings.critic_local_model == name
