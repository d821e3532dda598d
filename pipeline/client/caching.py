"""The provider's prefix cache: the ``prompt_cache_key`` each call sends, while accepted.

A record's calls form one conversation (``core.prompts``), so each call's prompt extends
the previous one's and a provider's prefix cache serves the history once; the record's id
as OpenAI's ``prompt_cache_key`` routes a record's calls to the same cache. Servers that
do not know the parameter either ignore it (vLLM, llama.cpp) or refuse the request with a
400 naming it (strict validators): then the key is dropped for that endpoint and the call
is sent again without it, costing no retry. What the cache served comes back as
``usage.prompt_tokens_details.cached_tokens`` and is priced at the cached rate
(``prices``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["CACHE_KEY_PARAM", "cache_key_refused", "cache_options"]

CACHE_KEY_PARAM = "prompt_cache_key"


def cache_options(cache_key: str | None, accepted: bool) -> Mapping[str, Any]:
    """The request-body field carrying ``cache_key``, where there is one and it is accepted."""
    if cache_key is None or not accepted:
        return {}
    return {CACHE_KEY_PARAM: cache_key}


def cache_key_refused(status: int | None, message: str, param: str | None) -> bool:
    """Whether an error answer refuses the ``prompt_cache_key`` parameter itself.

    A 400 naming it (unknown, unrecognized, extra fields not permitted, too long): it is
    no use to the endpoint, and the request may go again without it.
    """
    if status != 400:
        return False
    return param == CACHE_KEY_PARAM or CACHE_KEY_PARAM in message
