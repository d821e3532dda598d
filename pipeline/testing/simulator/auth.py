"""Bearer-token authentication, with OpenAI's messages (never echoing a whole key)."""

from __future__ import annotations

from .replies import error_body

__all__ = ["auth_error", "mask_key"]


def mask_key(token: str) -> str:
    """The key as OpenAI shows it in errors: its ends, the middle starred out."""
    if len(token) <= 8:
        return "*" * len(token)
    return f"{token[:3]}{'*' * min(len(token) - 7, 20)}{token[-4:]}"


def auth_error(api_key: str | None, headers: dict[str, str]) -> bytes | None:
    """The 401 error body for a request whose bearer token is not ``api_key``, else None."""
    if api_key is None:
        return None
    auth = headers.get("authorization", "")
    token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    if token == api_key:
        return None
    if token:
        message = (
            f"Incorrect API key provided: {mask_key(token)}. You can find your API key at "
            "https://platform.openai.com/account/api-keys."
        )
    else:
        message = (
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    return error_body(message, "invalid_request_error", None, "invalid_api_key")
