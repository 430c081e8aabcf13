"""Read a sentence-transformers model folder without loading it.

A sentence-transformers folder lists its modules in ``modules.json``: a ``Transformer``
(Hugging Face weights, ``tokenizer.json``, ``sentence_bert_config.json`` with
``max_seq_length``), a ``Pooling`` (``1_Pooling/config.json``) and often a ``Normalize``.
The ONNX exporter and the ONNX embedder need exactly those facts, read here once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quarry.errors import ConfigError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class StLayout:
    """The parts of a sentence-transformers model folder Quarry uses.

    Attributes:
        root: The model folder.
        transformer_dir: Folder of the Hugging Face encoder (weights, config, tokenizer).
        max_seq_length: Inputs are truncated to this many tokens (including [CLS]/[SEP]).
        dim: Sentence embedding dimension.
        weights: The encoder's weight file.
    """

    root: Path
    transformer_dir: Path
    max_seq_length: int
    dim: int
    weights: Path

    @property
    def tokenizer_file(self) -> Path:
        """The fast tokenizer (``tokenizer.json``) of the encoder."""
        return self.transformer_dir / "tokenizer.json"

    def weights_digest(self) -> str:
        """SHA-256 (hex) of the weight file: the cache key of anything exported from it."""
        digest = hashlib.sha256()
        with self.weights.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc


def _module_dir(root: Path, modules: list[dict[str, Any]], kind: str) -> Path | None:
    for module in modules:
        if str(module.get("type", "")).endswith(f".{kind}"):
            return root / str(module.get("path", ""))
    return None


def read_layout(root: Path) -> StLayout:
    """Describe the sentence-transformers model in ``root``.

    Args:
        root: A sentence-transformers folder (``modules.json`` + encoder + pooling config).

    Returns:
        The :class:`StLayout` of the folder. ``max_seq_length`` is capped at the encoder's
        ``max_position_embeddings`` (``config.json``): a longer setting would let texts through
        that the position table cannot hold.

    Raises:
        ConfigError: A file is missing or malformed, the tokenizer is not a fast
            ``tokenizer.json``, or the pooling is not mean pooling (the only mode the ONNX path
            implements).
    """
    try:
        return _read_layout(root)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # JSON of the wrong shape
        raise ConfigError(f"{root} is not a well-formed sentence-transformers folder: {exc!r}") from exc


def _read_layout(root: Path) -> StLayout:
    modules = _read_json(root / "modules.json")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ConfigError(f"{root / 'modules.json'} must be a list of module objects")
    transformer_dir = _module_dir(root, modules, "Transformer") or root
    pooling_dir = _module_dir(root, modules, "Pooling")
    if pooling_dir is None:
        raise ConfigError(f"{root} has no Pooling module in modules.json")
    pooling = _read_json(pooling_dir / "config.json")
    if not isinstance(pooling, dict):
        raise ConfigError(f"{pooling_dir / 'config.json'} must be a JSON object")
    if not pooling.get("pooling_mode_mean_tokens") or any(
        v for k, v in pooling.items() if k.startswith("pooling_mode_") and k != "pooling_mode_mean_tokens"
    ):
        raise ConfigError(f"{root}: only mean pooling is supported on the ONNX path, got {pooling}")
    st_config = transformer_dir / "sentence_bert_config.json"
    max_seq_length = int(_read_json(st_config)["max_seq_length"]) if st_config.is_file() else 512
    hf_config = transformer_dir / "config.json"
    if hf_config.is_file():
        positions = _read_json(hf_config).get("max_position_embeddings")
        if isinstance(positions, int) and positions > 0:
            max_seq_length = min(max_seq_length, positions)
    if max_seq_length < 2:
        raise ConfigError(f"{st_config}: max_seq_length must be >= 2 ([CLS] and [SEP]), got {max_seq_length}")
    weights = next((transformer_dir / w for w in WEIGHT_FILES if (transformer_dir / w).is_file()), None)
    if weights is None:
        raise ConfigError(f"{transformer_dir} holds none of the weight files {WEIGHT_FILES}")
    if not (transformer_dir / "tokenizer.json").is_file():
        raise ConfigError(f"{transformer_dir} has no tokenizer.json (a fast tokenizer is required)")
    return StLayout(
        root=root,
        transformer_dir=transformer_dir,
        max_seq_length=max_seq_length,
        dim=int(pooling["word_embedding_dimension"]),
        weights=weights,
    )
