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
=========================================  ==============================================
"""

from __future__ import annotations

from urllib.parse import urlsplit

from embedding.base import Embedder
from quarry.errors import ConfigError, missing_extra
from quarry.settings import Settings

SCHEMES = ("torch", "onnx", "triton+grpc", "triton+http")


def open_embedder(url: str, settings: Settings) -> Embedder:
    """Build the embedder a URL names (weights load later, in ``warm_up``).

    Raises:
        ConfigError: Unknown scheme (lists the supported ones), missing extra, unknown model.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    cfg = settings.embedding
    if scheme == "torch":
        from embedding.sentence_transformers import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder(
            parts.netloc + parts.path, batch_size=cfg.batch_size, device=cfg.device, cache_dir=settings.model_cache_dir
        )
    if scheme == "onnx":
        try:
            from embedding.onnx import OnnxEmbedder
        except ImportError as exc:
            raise missing_extra("onnxruntime", "onnx") from exc
        return OnnxEmbedder.from_url(url, cache_dir=settings.model_cache_dir, batch_size=cfg.batch_size)
    if scheme in ("triton+grpc", "triton+http"):
        try:
            from embedding.triton import TritonEmbedder
        except ImportError as exc:  # tritonclient or tenacity
            raise missing_extra(exc.name or "tritonclient", "triton") from exc
        return TritonEmbedder.from_url(url, timeout_s=cfg.timeout_s, batch_size=cfg.batch_size)
    raise ConfigError(f"unsupported embedding URL scheme {scheme!r} in {url!r}; supported: {', '.join(SCHEMES)}")
