"""BM25 over a collection's chunks, with bm25s (Lù, 2024, arXiv:2407.03618) as the engine.

A :class:`BM25Index` is an immutable snapshot: the bm25s sparse score matrix plus, row by row,
the chunk id, the document id and the payload (for filters). Upserts and deletes build a new
snapshot from the exact token lists kept in the docstore, so the statistics (N, avgdl, df) are
always those of the live chunks; the owner swaps snapshots atomically. Snapshots persist to a
folder with bm25s' own format plus a small sidecar of row data and a version stamp.

With ``method="robertson"`` and the same ``k1``/``b``, scores equal rank-bm25's ``BM25Okapi``
(Robertson & Zaragoza, 2009) for every term of positive idf (tested). bm25s leaves out the
constant ``(k1 + 1)`` numerator factor of the Okapi formula (rank-equivalent, as Lucene does);
for ``robertson`` we put it back so the scores are the textbook values
(:func:`indexing.bm25_formulas.okapi_scale`, shared with the live index).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

import bm25s
import numpy as np
import numpy.typing as npt

from indexing.bm25_formulas import okapi_scale
from indexing.snapshot_io import replace_folder
from quarry.settings import BM25Settings

_SIDECAR = "rows.json"


class SnapshotUnreadable(Exception):
    """A saved snapshot cannot be read, or its parts disagree with each other (damaged files)."""


class BM25Hit(NamedTuple):
    """One BM25 result of :meth:`BM25Index.search`: row in the snapshot, chunk id, document id, score.

    The query path reads :meth:`BM25Index.top`'s arrays instead and builds no hit per row.
    """

    row: int
    chunk_id: str
    document_id: str
    score: float


class BM25Index:
    """An immutable BM25 snapshot of a collection's chunks.

    Attributes:
        version: Docstore version the snapshot was built from.
        chunk_ids: Row -> chunk id.
        document_ids: Row -> document id.
        payloads: Row -> payload dict (for filter masks).
    """

    def __init__(
        self,
        retriever: bm25s.BM25 | None,
        chunk_ids: list[str],
        document_ids: list[str],
        payloads: list[dict[str, Any]],
        version: int,
        scale: float = 1.0,
    ) -> None:
        self._retriever = retriever
        self._scale = scale
        self.chunk_ids = chunk_ids
        self.document_ids = document_ids
        self.payloads = payloads
        self.version = version

    def __len__(self) -> int:
        return len(self.chunk_ids)

    @classmethod
    def build(
        cls,
        rows: Sequence[tuple[str, str, list[str], dict[str, Any]]],
        params: BM25Settings,
        version: int,
    ) -> BM25Index:
        """Index chunks.

        Args:
            rows: ``(chunk_id, document_id, tokens, payload)`` per chunk.
            params: bm25s method, ``k1`` and ``b``.
            version: Docstore version stamp.

        Returns:
            A new snapshot of the rows with at least one token (empty when there are none).
            A chunk without tokens (only punctuation, emoji or stop words) can never score, and
            it does not count in the collection statistics, as in Lucene, whose ``docCount``
            counts documents holding a term of the field.
        """
        rows = [r for r in rows if r[2]]
        if not rows:
            return cls(None, [], [], [], version)
        retriever = bm25s.BM25(method=params.method, k1=params.k1, b=params.b)
        retriever.index([list(r[2]) for r in rows], show_progress=False)
        return cls(
            retriever,
            [r[0] for r in rows],
            [r[1] for r in rows],
            [r[3] for r in rows],
            version,
            okapi_scale(params.method, params.k1),
        )

    def scores(self, query_tokens: Sequence[str], max_terms: int | None = None) -> npt.NDArray[np.float32]:
        """BM25 score of every row for a tokenised query: ``(len(self),) float32``.

        Args:
            query_tokens: Output of :func:`indexing.text.tokenize` for the query.
            max_terms: Score only the first ``max_terms`` distinct terms of the query found in
                the index (each with all its occurrences); ``None``: all. Scoring reads one
                posting list per distinct term, so this bounds a long query's cost.
        """
        if self._retriever is None:
            return np.zeros(0, dtype=np.float32)
        vocab = self._retriever.vocab_dict
        known = [t for t in query_tokens if t in vocab]
        if max_terms is not None and len(known) > max_terms:
            kept = set(list(dict.fromkeys(known))[:max_terms])  # distinct, in query order
            known = [t for t in known if t in kept]
        if not known:
            return np.zeros(len(self), dtype=np.float32)
        scores = np.asarray(self._retriever.get_scores(known), dtype=np.float32)
        return scores * np.float32(self._scale) if self._scale != 1.0 else scores

    @cached_property
    def document_codes(self) -> npt.NDArray[np.int64]:
        """Row -> a small integer per distinct document id, ``(len(self),) int64``.

        Lets the query path keep each document's best row with numpy instead of a Python loop
        (computed once per snapshot; snapshots never change).
        """
        codes: dict[str, int] = {}
        return np.fromiter((codes.setdefault(d, len(codes)) for d in self.document_ids), np.int64, len(self))

    def top(
        self,
        query_tokens: Sequence[str],
        top_n: int,
        keep: Callable[[dict[str, Any]], bool] | None = None,
        max_terms: int | None = None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """The best ``top_n`` rows with a positive score, as arrays (the query path's form).

        Args:
            query_tokens: Output of :func:`indexing.text.tokenize` for the query.
            top_n: Largest number of rows.
            keep: Payload predicate (a compiled filter); rows it rejects are never returned.
            max_terms: See :meth:`scores`.

        Returns:
            ``(rows, scores)``: ``(m,) int64`` row numbers and their ``(m,) float32`` scores,
            ``m <= top_n``, in decreasing score order (ties broken by row, i.e. insertion order).
        """
        scores = self.scores(query_tokens, max_terms)
        if keep is not None and len(scores):
            mask = np.fromiter((keep(p) for p in self.payloads), dtype=bool, count=len(scores))
            scores = np.where(mask, scores, 0.0).astype(np.float32)
        positive = np.flatnonzero(scores > 0)
        if len(positive) > top_n:
            part = np.argpartition(-scores[positive], top_n - 1)[:top_n]
            positive = positive[part]
        order = positive[np.lexsort((positive, -scores[positive]))]
        return order.astype(np.int64, copy=False), scores[order]

    def search(
        self,
        query_tokens: Sequence[str],
        top_n: int,
        keep: Callable[[dict[str, Any]], bool] | None = None,
    ) -> list[BM25Hit]:
        """:meth:`top` as hits: the best ``top_n`` rows with a positive score, best first."""
        rows, scores = self.top(query_tokens, top_n, keep)
        chunk_ids, document_ids = self.chunk_ids, self.document_ids
        return [
            BM25Hit(r, chunk_ids[r], document_ids[r], score)
            for r, score in zip(rows.tolist(), scores.tolist(), strict=True)
        ]

    def save(self, folder: Path) -> None:
        """Persist to ``folder`` atomically (written beside it, then renamed into place).

        The names beside it are this process's own, so workers sharing a data dir that save the
        same collection at once do not write into each other's files; the loser of the final
        rename gets an ``OSError`` (the caller serves its snapshot from memory).

        Raises:
            OSError: The folder cannot be written, or another process renamed its own in first.
        """

        def write(tmp: Path) -> None:
            if self._retriever is not None:
                self._retriever.save(str(tmp), show_progress=False)
            sidecar = {
                "version": self.version,
                "chunk_ids": self.chunk_ids,
                "document_ids": self.document_ids,
                "payloads": self.payloads,
                "scale": self._scale,
            }
            (tmp / _SIDECAR).write_text(json.dumps(sidecar), encoding="utf-8")

        replace_folder(folder, write)

    @classmethod
    def load(cls, folder: Path) -> BM25Index:
        """Load a snapshot saved by :meth:`save`.

        Raises:
            SnapshotUnreadable: A file is missing, truncated or malformed, or the parts disagree
                (rows vs the score matrix's documents, the vocabulary vs the matrix's columns).
        """
        try:
            sidecar = json.loads((folder / _SIDECAR).read_text(encoding="utf-8"))
            chunk_ids, document_ids, payloads = sidecar["chunk_ids"], sidecar["document_ids"], sidecar["payloads"]
            snap = cls(None, chunk_ids, document_ids, payloads, int(sidecar["version"]), float(sidecar.get("scale", 1)))
            if chunk_ids:
                snap._retriever = bm25s.BM25.load(str(folder), show_progress=False)
        except Exception as exc:  # a damaged file raises anything: EOFError, ValueError, OSError, KeyError...
            raise SnapshotUnreadable(f"{type(exc).__name__}: {exc}") from exc
        problem = snap._inconsistency()
        if problem is not None:
            raise SnapshotUnreadable(problem)
        return snap

    def _inconsistency(self) -> str | None:
        """What disagrees between the snapshot's parts, or ``None``."""
        n = len(self.chunk_ids)
        if not isinstance(self.chunk_ids, list) or len(self.document_ids) != n or len(self.payloads) != n:
            return f"{n} chunk ids, {len(self.document_ids)} document ids, {len(self.payloads)} payloads"
        if self._retriever is None:
            return None if n == 0 else f"{n} rows but no score matrix"
        scores, vocab = self._retriever.scores, self._retriever.vocab_dict
        indptr, indices, data = scores["indptr"], scores["indices"], scores["data"]
        if scores["num_docs"] != n:
            return f"{n} rows but a score matrix of {scores['num_docs']} documents"
        top_term = max((i for term, i in vocab.items() if term), default=-1)  # bm25s adds "", with no column
        if top_term >= len(indptr) - 1 or int(indptr[-1]) != len(indices) or len(indices) != len(data):
            return f"a score matrix of {len(indptr) - 1} terms and {len(data)} values for a vocabulary of {len(vocab)}"
        if len(indices) and not 0 <= int(indices.min()) <= int(indices.max()) < n:
            return f"score matrix rows outside 0..{n - 1}"
        return None
