"""A BERT bi-encoder with random weights, built locally: real torch and sentence-transformers code, tiny compute.

For tests in which the service must embed every chunk but no vector is ever scored (a BM25-only
evaluation): the packaged MiniLM would spend minutes of a cold CI machine on vectors nobody reads.
The folder has the packaged all-MiniLM-L6-v2's layout and tokenizer (WordPiece, 256 tokens,
mean pooling, normalised), so :class:`embedding.sentence_transformers.SentenceTransformerEmbedder`
loads, batches and truncates it exactly as it does the real model; only the transformer is a
seeded random BERT of hidden 32, 1 layer (as :mod:`rerank.tiny` builds its cross-encoder).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rerank.tiny import packaged_tokenizer_dir

HIDDEN = 32


def build_tiny_bi_encoder(out_dir: Path, *, seed: int = 0) -> Path:
    """Write the tiny bi-encoder to ``out_dir`` (created) and return it (a ``torch://`` model folder).

    The same seed gives the same weights. Dimension :data:`HIDDEN`, ``max_seq_length`` 256.
    """
    import torch
    from transformers import BertConfig, BertModel

    source = packaged_tokenizer_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "sentence_bert_config.json", "modules.json"):
        shutil.copyfile(source / name, out_dir / name)
    pooling = json.loads((source / "1_Pooling" / "config.json").read_text())
    (out_dir / "1_Pooling").mkdir(exist_ok=True)
    (out_dir / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "word_embedding_dimension": HIDDEN}))
    (out_dir / "2_Normalize").mkdir(exist_ok=True)
    vocab = sum(1 for _ in (source / "vocab.txt").open(encoding="utf-8"))
    config = BertConfig(
        vocab_size=vocab, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=512,
    )
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(str(out_dir))
    return out_dir
