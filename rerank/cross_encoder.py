"""A sentence-transformers ``CrossEncoder`` behind the :class:`~rerank.base.Reranker` seam.

Which model to use
------------------
Point ``QUARRY_RERANK__MODEL`` at a local folder holding ``cross-encoder/ms-marco-MiniLM-L-6-v2``
(BERT, 6 layers, hidden 384, 22.7M parameters, trained on MS MARCO passage ranking). Nothing is
downloaded at run time where the network is closed: fetch it once where it is open, e.g.
``hf download cross-encoder/ms-marco-MiniLM-L-6-v2 --local-dir /models/ms-marco-MiniLM-L-6-v2``,
and set ``QUARRY_RERANK__MODEL=/models/ms-marco-MiniLM-L-6-v2``. A hub name works only where the
Hugging Face Hub can be reached (or the model is in the local HF cache).

Published quality (``../shared/data/REFERENCE_SCORES.md``): reranking the BM25 top-100 with
ms-marco-MiniLM-L-6-v2 gives SciFact nDCG@10 0.688 against 0.665 for BM25 alone (Thakur et al.,
BEIR, NeurIPS 2021 D&B, arXiv:2104.08663, Table 2 "BM25+CE"; 0.676 -> 0.688 on the model card
of juanluisdb/MiniLM-L-6-rerank-m3). Recall@100 cannot change: a rerank permutes the top-100.

Tests and ``bench/rerank.py`` use a randomly initialised BERT of the same layout built by
:func:`rerank.tiny.build_tiny_cross_encoder`; it exercises this code, not relevance.

Runtime
-------
``device="auto"`` runs on CUDA in fp16 when a GPU is present, else on the CPU in fp32. Scores are
the raw logits (no sigmoid) as float32. One lock serialises model calls: the REST API calls
:meth:`CrossEncoderReranker.score` from worker threads, the fast tokenizer is not re-entrant, and
on a small CPU parallel forwards only compete for the same cores.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

from quarry.errors import ConfigError, RerankError

if TYPE_CHECKING:
    from sentence_transformers import CrossEncoder

DeviceChoice = Literal["auto", "cpu", "cuda"]

RECOMMENDED_MODEL = "cross-encoder/ms-marco-MiniLM-L-6-v2"
_HOW_TO_GET_ONE = (
    f"download {RECOMMENDED_MODEL} to a folder (where the network is open: "
    f"hf download {RECOMMENDED_MODEL} --local-dir /path) and set QUARRY_RERANK__MODEL=/path"
)


def resolve_device(choice: DeviceChoice) -> str:
    """Pick where inference runs.

    Args:
        choice: ``auto`` (CUDA when present, else CPU), ``cpu`` or ``cuda``.

    Returns:
        ``"cuda"`` or ``"cpu"``.

    Raises:
        ConfigError: ``cuda`` was asked for and no CUDA device is visible.
    """
    import torch

    has_cuda = bool(torch.cuda.is_available())
    if choice == "cuda" and not has_cuda:
        raise ConfigError("QUARRY_RERANK__DEVICE=cuda but no CUDA device is visible to torch")
    if choice == "cpu":
        return "cpu"
    return "cuda" if has_cuda else "cpu"


def _looks_like_path(model: str) -> bool:
    """A hub name is ``name`` or ``org/name``; anything else is a filesystem path."""
    return model.startswith(("/", ".", "~")) or model.count("/") > 1 or "\\" in model


def _check_source(model: str) -> tuple[str, bool]:
    """Validate ``model`` and tell whether it is a local folder.

    Returns:
        ``(name_or_path, is_local)``.

    Raises:
        ConfigError: Empty, a URL, a missing path, or a folder that is not a model.
    """
    if not model:
        raise ConfigError(f"no cross-encoder configured: {_HOW_TO_GET_ONE}")
    if "://" in model:
        raise ConfigError(f"rerank model {model!r} is a URL; give a local folder or a hub name: {_HOW_TO_GET_ONE}")
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"rerank model folder {str(path)!r} has no config.json, so it is not a "
                f"Hugging Face cross-encoder; {_HOW_TO_GET_ONE}"
            )
        return str(path), True
    if path.exists() or _looks_like_path(model):
        raise ConfigError(f"rerank model folder {str(path)!r} does not exist; {_HOW_TO_GET_ONE}")
    return model, False


def _load(model: str, device: str, max_length: int | None) -> CrossEncoder:
    """Load a cross-encoder on ``device`` (fp16 on CUDA), raw logits out.

    Raises:
        ConfigError: The model cannot be found locally or fetched.
        RerankError: The files were found but do not load as a cross-encoder.
    """
    name, is_local = _check_source(model)
    try:
        import torch
        from sentence_transformers import CrossEncoder
    except ImportError as exc:  # pragma: no cover - core dependencies
        raise ConfigError(f"sentence-transformers/torch are not importable: {exc}") from exc
    try:
        encoder: CrossEncoder = CrossEncoder(
            name,
            device=device,
            local_files_only=is_local,
            max_length=max_length,
            activation_fn=torch.nn.Identity(),
        )
    except OSError as exc:
        where = "the folder" if is_local else "the local cache or the Hugging Face Hub"
        raise ConfigError(f"cannot load cross-encoder {name!r} from {where} ({exc}); {_HOW_TO_GET_ONE}") from exc
    except Exception as exc:  # corrupt weights, wrong architecture: any loader error
        raise RerankError(f"{name!r} does not load as a cross-encoder: {exc}") from exc
    if encoder.num_labels != 1:
        raise RerankError(f"{name!r} has {encoder.num_labels} output labels; a reranker needs exactly 1 (a score)")
    architectures = getattr(getattr(encoder.model, "config", None), "architectures", None) or []
    if architectures and not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise RerankError(
            f"{name!r} is a {', '.join(architectures)}, not a cross-encoder (a *ForSequenceClassification "
            "model): its scoring head would be random weights. A sentence-embedding (bi-encoder) model "
            f"belongs in QUARRY_EMBEDDING__URL; {_HOW_TO_GET_ONE}"
        )
    if device == "cuda":
        encoder.half()
    encoder.eval()
    return encoder


class CrossEncoderReranker:
    """Score (query, passage) pairs with a sentence-transformers cross-encoder.

    Attributes:
        model_id: Local folder or hub name, as configured.
        device: ``"cuda"`` or ``"cpu"``, resolved at construction.
        dtype: ``"float16"`` on CUDA, ``"float32"`` on the CPU.
        batch_size: Pairs per forward pass.
    """

    def __init__(
        self,
        model: str,
        *,
        device: DeviceChoice = "auto",
        batch_size: int = 32,
        max_length: int | None = None,
    ) -> None:
        """Describe the reranker; nothing is loaded until :meth:`warm_up`.

        Args:
            model: Local folder of a cross-encoder, or a hub name where the network allows.
            device: ``auto`` (CUDA fp16 when present), ``cpu`` or ``cuda``.
            batch_size: Pairs per forward pass (>= 1).
            max_length: Truncate each (query, passage) pair to this many tokens; ``None`` keeps
                the model's limit (512 for ms-marco-MiniLM-L-6-v2).

        Raises:
            ConfigError: ``cuda`` asked for without a GPU, or ``batch_size`` < 1.
        """
        if batch_size < 1:
            raise ConfigError(f"rerank batch_size must be >= 1, got {batch_size}")
        self.model_id = model
        self.device = resolve_device(device)
        self.dtype = "float16" if self.device == "cuda" else "float32"
        self.batch_size = batch_size
        self._max_length = max_length
        self._encoder: CrossEncoder | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        """Whether :meth:`warm_up` has loaded the weights."""
        return self._encoder is not None

    def warm_up(self) -> None:
        """Load the weights and run one pair through the model; idempotent and thread-safe.

        Raises:
            ConfigError: The model cannot be found (the message says how to get one).
            RerankError: The files do not load as a single-score cross-encoder.
        """
        with self._lock:
            if self._encoder is not None:
                return
            encoder = _load(self.model_id, self.device, self._max_length)
            encoder.predict([("warm up", "warm up")], batch_size=1, show_progress_bar=False)
            self._encoder = encoder

    def score(self, query: str, passages: Sequence[str]) -> npt.NDArray[np.float32]:
        """Relevance of each passage to ``query``.

        Args:
            query: The query text.
            passages: ``n`` passage texts; each pair is truncated to the model's max length.
                Loads the model first if :meth:`warm_up` was not called.

        Returns:
            ``(n,) float32`` raw logits, higher is more relevant; independent of batching.

        Raises:
            ConfigError: Not warmed up yet and the model cannot be found.
            RerankError: The forward pass failed.
        """
        if not passages:
            return np.zeros(0, dtype=np.float32)
        if self._encoder is None:  # call warm_up() at startup so no request pays the load
            self.warm_up()
        encoder = self._encoder
        assert encoder is not None
        pairs = [(query, passage) for passage in passages]
        import torch

        try:
            with self._lock, torch.inference_mode():
                scores = encoder.predict(pairs, batch_size=self.batch_size, show_progress_bar=False)
        except (RuntimeError, ValueError) as exc:
            raise RerankError(f"cross-encoder {self.model_id!r} failed: {exc}") from exc
        return np.asarray(scores, dtype=np.float32).reshape(len(passages))
