"""ONNX Runtime embedding on CPU (``onnx://`` URLs): the fast path without torch at query time.

``onnx://all-MiniLM-L6-v2?quantize=int8`` (default ``int8``; ``quantize=none`` is fp32) exports
the packaged sentence-transformers model once (:mod:`embedding.onnx_export`, cached under
``cache_dir``), then runs it with an ``onnxruntime.InferenceSession``. ``onnx:///path/to/model``
takes a local sentence-transformers folder. ``threads=N`` sets ONNX Runtime's intra-op threads
(default: the CPUs this process may use). A REST server on a small machine does better with
``threads=1``, which leaves the other cores to the event loop and the vector store: on 2 cores,
32 clients, 270 vs 245 req/s (two servers measured alternately, 10 s each, 5 rounds).

Tokenisation uses the model's own fast tokenizer (``tokenizer.json``, Hugging Face
``tokenizers``), truncated to ``max_seq_length``; mean pooling over the attention mask and L2
normalisation are done in numpy, as sentence-transformers does (Reimers & Gurevych, 2019).
Inputs are sorted by length and grouped into calls that pad little (:mod:`embedding.length_batches`).

int8 (dynamic quantisation) scales activations per batch tensor, so an int8 vector depends
slightly on the other texts of its batch (800 SciFact documents and queries, batches of 32 vs one
at a time: min cosine 0.989, mean 0.995, with the ``dot`` recipe); fp32 does not.
Measured on all 5,183 SciFact documents against the torch model: see tests/embedding/test_onnx.py.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import numpy as np
import numpy.typing as npt

from embedding.base import Embeddings
from embedding.card import CardOverrides, ModelCard, folder_card
from embedding.length_batches import plan_batches
from embedding.onnx_export import Quantize, ensure_onnx
from embedding.sentence_transformers import fingerprint_of, model_id_for, resolve_model_path
from embedding.st_layout import StLayout, read_layout
from quarry.errors import ConfigError, EmbeddingError, missing_extra

# Fixed cost of one ONNX Runtime call in tokens of compute (int8 MiniLM here: ~0.3 ms vs ~0.12 ms
# per token), for grouping texts of similar length (embedding.length_batches).
_CALL_COST_TOKENS = 3.0
_QUANTIZE = {"int8": "int8", "none": "none", "fp32": "none"}
_MAX_THREADS = 1024


def parse_onnx_url(url: str) -> tuple[str, Quantize, int | None]:
    """Split an ``onnx://`` URL into (model name or path, quantisation, threads).

    Raises:
        ConfigError: Wrong scheme, no model, or an unknown/invalid query parameter.
    """
    parts = urlsplit(url)
    if parts.scheme.lower() != "onnx" or not (parts.netloc + parts.path).strip("/"):
        raise ConfigError(f"expected onnx://<model>[?quantize=int8|none] or onnx:///path, got {url!r}")
    params = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    unknown = set(params) - {"quantize", "threads"}
    if unknown:
        raise ConfigError(f"unknown parameter(s) {sorted(unknown)} in {url!r}; known: quantize, threads")
    quantize = _QUANTIZE.get(params.get("quantize", "int8").lower())
    if quantize is None:
        raise ConfigError(f"quantize must be int8 or none (fp32) in {url!r}")
    threads = params.get("threads")
    if threads is not None and not (threads.isascii() and threads.isdigit() and 0 < int(threads) <= _MAX_THREADS):
        raise ConfigError(f"threads must be an integer in 1-{_MAX_THREADS} in {url!r}")
    return parts.netloc + parts.path, cast(Quantize, quantize), int(threads) if threads else None


class OnnxEmbedder:
    """Sentence embeddings with ONNX Runtime; safe to call from many threads.

    Args:
        model: Packaged model name (``all-MiniLM-L6-v2``) or a sentence-transformers folder.
        cache_dir: Where the exported ONNX files are cached.
        quantize: ``"int8"`` (dynamic, per-channel weights) or ``"none"`` (fp32).
        batch_size: Texts per ONNX Runtime call.
        threads: Intra-op threads; default the CPUs available to this process.
        card: The URL's ``languages``/``query_prefix``/``passage_prefix`` over what the folder
            declares (:mod:`embedding.card`).
    """

    def __init__(
        self,
        model: str,
        *,
        cache_dir: Path,
        quantize: Quantize = "int8",
        batch_size: int = 64,
        threads: int | None = None,
        card: CardOverrides | None = None,
    ) -> None:
        self.model_id = model_id_for(model)
        self.fingerprint = ""  # of the sentence-transformers folder, as torch:// has it (set by warm_up)
        self.quantize: Quantize = quantize
        self._path = resolve_model_path(model)
        self.card: ModelCard = (card or CardOverrides()).over(folder_card(self._path))
        self._cache_dir = cache_dir
        self._batch_size = batch_size
        self._threads = threads or len(os.sched_getaffinity(0))
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        self._input_names: list[str] = []
        self.layout: StLayout | None = None
        self.onnx_path: Path | None = None
        self.dim = 0
        self.max_seq_length = 0

    @classmethod
    def from_url(
        cls, url: str, cache_dir: Path, batch_size: int = 64, card: CardOverrides | None = None
    ) -> OnnxEmbedder:
        """Build from ``onnx://<model>?quantize=int8|none[&threads=N]`` (nothing loads yet).

        Raises:
            ConfigError: Malformed URL or a model that is neither packaged nor a folder.
        """
        model, quantize, threads = parse_onnx_url(url)
        return cls(model, cache_dir=cache_dir, quantize=quantize, batch_size=batch_size, threads=threads, card=card)

    def warm_up(self) -> None:
        """Export/quantise once (cached), open the ONNX Runtime session and the tokenizer.

        Raises:
            ConfigError: The model folder lacks a fast tokenizer or uses non-mean pooling, or
                onnxruntime/onnx are not installed (``pip install 'quarry[onnx]'``).
            EmbeddingError: Export or session creation failed.
        """
        with self._lock:
            if self._session is not None:
                return
            try:
                import onnx  # noqa: F401  (the export needs it; checked before any work)
                import onnxruntime as ort
            except ImportError as exc:
                raise missing_extra(exc.name or "onnxruntime", "onnx") from exc
            from tokenizers import Tokenizer

            layout = read_layout(self._path)
            self.fingerprint = self.card.fold(fingerprint_of(self._path, self._cache_dir))
            path = ensure_onnx(layout, self._cache_dir, self.model_id, self.quantize)
            try:
                session = ort.InferenceSession(
                    str(path), self._session_options(ort), providers=["CPUExecutionProvider"]
                )
            except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
                raise EmbeddingError(f"cannot open ONNX model {path}: {exc}") from exc
            try:
                tokenizer = Tokenizer.from_file(str(layout.tokenizer_file))
            except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
                raise ConfigError(f"cannot read the tokenizer {layout.tokenizer_file}: {exc}") from exc
            tokenizer.no_padding()
            tokenizer.enable_truncation(max_length=layout.max_seq_length)
            self._tokenizer, self.layout, self.onnx_path = tokenizer, layout, path
            self._input_names = [i.name for i in session.get_inputs()]
            self.dim, self.max_seq_length = layout.dim, layout.max_seq_length
            self._session = session

    def _session_options(self, ort: Any) -> Any:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.intra_op_num_threads = self._threads
        options.inter_op_num_threads = 1
        # Busy-waiting workers burn CPU that concurrent callers (and other processes) need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return options

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """Embed document texts: ``(n, dim) float32`` L2-normalised rows plus truncation flags.

        Raises:
            EmbeddingError: ONNX Runtime failed on the batch.
        """
        return self._embed(self.card.prefixed(texts, query=False))

    def embed_queries(self, texts: Sequence[str]) -> Embeddings:
        """Embed queries (the card's query prefix first); see :meth:`embed`."""
        return self._embed(self.card.prefixed(texts, query=True))

    def _embed(self, texts: Sequence[str]) -> Embeddings:
        self.warm_up()
        if not texts:
            return Embeddings(np.zeros((0, self.dim), np.float32), np.zeros(0, bool))
        encodings = self._tokenizer.encode_batch(list(texts))
        truncated = np.fromiter((bool(e.overflowing) for e in encodings), bool, len(encodings))
        lengths = np.fromiter((len(e.ids) for e in encodings), np.int64, len(encodings))
        vectors = np.empty((len(texts), self.dim), np.float32)
        for group in plan_batches(lengths.tolist(), self._batch_size, _CALL_COST_TOKENS):
            rows = np.asarray(group)
            vectors[rows] = self._forward([encodings[i].ids for i in group], lengths[rows])
        return Embeddings(vectors, truncated)

    def _forward(self, ids: list[list[int]], lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        width = int(lengths.max())
        input_ids = np.zeros((len(ids), width), np.int64)
        for row, seq in enumerate(ids):
            input_ids[row, : len(seq)] = seq
        mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
        feeds = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}
        try:
            (hidden,) = self._session.run(None, {k: feeds[k] for k in self._input_names})
        except Exception as exc:  # onnxruntime.capi errors
            raise EmbeddingError(f"ONNX Runtime failed on a batch of {len(ids)}: {exc}") from exc
        return mean_pool_normalize(hidden, mask)


def mean_pool_normalize(hidden: npt.NDArray[np.float32], mask: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    """Mean of the token vectors under ``mask``, then L2-normalised.

    Args:
        hidden: ``(b, seq, dim) float32`` token vectors.
        mask: ``(b, seq)`` 1 for real tokens, 0 for padding.

    Returns:
        ``(b, dim) float32`` unit vectors (a zero vector stays zero).
    """
    weights = mask.astype(np.float32)
    summed = np.einsum("bsd,bs->bd", hidden, weights)
    mean = summed / np.clip(weights.sum(axis=1, keepdims=True), 1e-9, None)
    norms = np.linalg.norm(mean, axis=1, keepdims=True)
    unit: npt.NDArray[np.float32] = (mean / np.clip(norms, 1e-12, None)).astype(np.float32, copy=False)
    return unit
