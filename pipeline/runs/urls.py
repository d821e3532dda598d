"""Where a run's calls go: the endpoints belong to the run, kept between its invocations.

A new run takes ``--base-url`` (and ``--feedback-base-url``), else the provider's variable
(``$OPENAI_BASE_URL``; ``$ANTHROPIC_BASE_URL`` for an ``anthropic:`` model), else the
provider's own API, and the manifest records them. An invocation on an existing RUN_DIR that
names no endpoint (a re-run, a resume) keeps the run's, whatever ``$OPENAI_BASE_URL`` now
says: a dataset meant for a local server never goes to a paid API because a shell lacks
a variable. Naming another endpoint is allowed; the manifest keeps every change in its
``endpoints`` history. URLs are kept as the manifest keeps them: credentials and query
strings dropped, so an endpoint that needs them is given again with ``--base-url``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ..client.models import OPENAI_URL, ModelId, Provider
from .manifest import EndpointUse, Manifest, clean_url, now_iso
from .settings import Settings

__all__ = [
    "LOCAL",
    "OPENAI_URL",
    "carry_endpoints",
    "endpoint_use",
    "provider_of",
    "record_endpoints",
    "run_urls",
]

LOCAL = "local"  # the embedded model, in the endpoint history (its port changes every start)


def provider_of(settings: Settings) -> Provider:
    """The provider of the run's generator (the embedded model: ``Provider.LOCAL``)."""
    return Provider.LOCAL if settings.local else ModelId.parse(settings.model).provider


def run_urls(manifest: Manifest) -> tuple[str, ...]:
    """The generator's endpoints a run recorded (empty: OpenAI's, or the embedded model).

    Manifests written before endpoints were kept in the settings hold the URL only at the
    top level (it may have come from ``$OPENAI_BASE_URL``).
    """
    s = manifest.settings
    if s.local:
        return ()
    if isinstance(s.base_url, tuple):
        return s.base_url
    url = s.base_url or manifest.base_url
    return (url,) if url else ()


def carry_endpoints(
    settings: Settings, old: Manifest | None, env: Mapping[str, str]
) -> tuple[Settings, str | None]:
    """The settings with the endpoints this invocation uses made explicit, and a note for
    the log when the environment names another endpoint than the run's."""
    note = None
    base_url = settings.base_url
    feedback_url = settings.feedback_base_url
    provider = provider_of(settings)
    var = provider.url_env
    from_env = (env.get(var) or None) if var else None
    if base_url is None and not settings.local:
        if old is not None and not old.settings.local:
            urls = run_urls(old)
            base_url = urls[0] if len(urls) == 1 else (urls or None)
            kept = ", ".join(urls) or provider_of(old.settings).default_url or OPENAI_URL
            if from_env and clean_url(from_env) not in urls:
                note = (
                    f"${var} ({clean_url(from_env)}) is not this run's endpoint: it keeps "
                    f"{kept} (give --base-url to move it)"
                )
        elif old is None:
            base_url = from_env
    if feedback_url is None and old is not None and not old.settings.critic_is_local:
        feedback_url = old.settings.feedback_base_url
    return replace(settings, base_url=base_url, feedback_base_url=feedback_url), note


def endpoint_use(
    urls: tuple[str, ...],
    local: bool,
    feedback_url: str | None,
    run: int,
    provider: Provider = Provider.ENDPOINT,
) -> EndpointUse:
    """This invocation's entry of the endpoint history (no URL: ``provider``'s own API)."""
    if local:
        generator: tuple[str, ...] = (LOCAL,)
    else:
        generator = tuple(clean_url(u) or u for u in urls) or (provider.default_url or OPENAI_URL,)
    return EndpointUse(generator, clean_url(feedback_url), run, now_iso())


def record_endpoints(
    manifest: Manifest, old: Manifest | None, use: EndpointUse
) -> tuple[Manifest, str | None]:
    """``manifest`` with ``use`` appended to the run's endpoint history when it changed, and
    a note for the log when it did."""
    history = old.endpoints if old is not None else ()
    if old is not None and not history:  # a manifest from before the history was kept
        s = old.settings
        first = endpoint_use(run_urls(old), s.local, s.feedback_base_url, 1, provider_of(s))
        history = (replace(first, at=old.created_at),)
    note = None
    if not history or not history[-1].same_place(use):
        if history:
            note = (
                f"the run's calls now go to {use.describe()} (they went to "
                f"{history[-1].describe()}); recorded in manifest.json"
            )
        history = (*history, use)
    return replace(manifest, endpoints=history), note
