"""The suite's one llama.cpp server (``scripts/services/llama.sh``): its URL and the settings to use it with."""

from __future__ import annotations

import os
from typing import Any

import httpx

from quarry.settings import LLMSettings

LLM_URL = os.environ.get("QUARRY_TEST_LLM_URL", "openai+http://127.0.0.1:8090/v1?model=smollm2")


def llama_settings(url: str = LLM_URL, **overrides: Any) -> LLMSettings:
    """LLM settings for the shared server, with deadlines that allow for a queue.

    The suite's pytest-xdist workers share the server, which generates one request at a time on one
    thread: a request may wait for other workers' generations before its first token. The
    deadlines' own behaviour is tested against the scripted stub (``tests/generation/test_answer_stub.py``).
    """
    values: dict[str, Any] = {"first_token_timeout_s": 300, "stall_timeout_s": 60, "total_timeout_s": 600}
    return LLMSettings(url=url, **{**values, **overrides})


def require_llama(url: str = LLM_URL) -> str:
    """The server's root URL (no ``/v1``); ``RuntimeError`` naming the start command when it does not answer."""
    base = url.split("?")[0].replace("openai+", "")
    try:
        httpx.get(f"{base}/models", timeout=60).raise_for_status()
    except httpx.HTTPError as exc:
        raise RuntimeError(f"no llama.cpp server at {url}: run bash scripts/services/llama.sh start") from exc
    return base.removesuffix("/v1")
