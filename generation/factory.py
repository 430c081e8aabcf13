"""Open the configured LLM backend by its URL's scheme, or none.

``QUARRY_LLM__URL`` empty (the default) means no LLM: ``/answer`` returns the retrieved sources
with ``answer: null``. ``openai+http://`` and ``openai+https://`` select
:class:`generation.openai_compat.OpenAICompatGenerator` (vLLM, llama.cpp, OpenAI).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from generation.base import Generator
from quarry.errors import ConfigError, missing_extra
from quarry.settings import LLMSettings

SCHEMES = ("openai+http", "openai+https")


def open_generator(settings: LLMSettings) -> Generator | None:
    """Build the backend ``settings.url`` names; it connects on first use.

    Returns:
        The generator, or ``None`` when ``url`` is empty.

    Raises:
        ConfigError: Unknown scheme or malformed URL, or the backend's extra is not installed.
    """
    url = settings.url.strip()
    if not url:
        return None
    scheme = urlsplit(url).scheme
    if scheme in SCHEMES:
        try:
            from generation.openai_compat import OpenAICompatGenerator
        except ImportError as exc:  # the openai package (and its httpx2) come with the extra
            raise missing_extra("openai", "llm") from exc

        return OpenAICompatGenerator(url, settings)
    raise ConfigError(f"unknown LLM URL scheme {scheme!r} in {url!r}; use one of {', '.join(SCHEMES)}")
