"""Read a BEIR folder: the corpus (streamed), the queries and the qrels of one split.

A BEIR folder (Thakur et al., "BEIR: A Heterogeneous Benchmark for Zero-shot Evaluation of
Information Retrieval Models", NeurIPS 2021 D&B, arXiv:2104.08663; layout of
``beir.datasets.data_loader.GenericDataLoader``) holds::

    corpus.jsonl     {"_id": str, "title": str, "text": str, "metadata": {...}}  one per line
    queries.jsonl    {"_id": str, "text": str, "metadata": {...}}                one per line
    qrels/<split>.tsv   header "query-id<TAB>corpus-id<TAB>score", one judgement per line

A split is defined by its qrels file: queries without a judgement in ``qrels/<split>.tsv`` are
not part of that split.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from indexing.sources import read_jsonl
from quarry.errors import InvalidDocument, InvalidRequest

QRELS_HEADER = ("query-id", "corpus-id", "score")
_HEADER_TEXT = "\t".join(QRELS_HEADER)


class CorpusDoc(TypedDict):
    """One corpus document as yielded by :func:`iter_corpus` (missing fields filled in)."""

    _id: str
    title: str
    text: str
    metadata: dict[str, Any]


@dataclass(frozen=True)
class BeirSplit:
    """Queries and relevance judgements of one split.

    Attributes:
        name: Split name, the stem of ``qrels/<name>.tsv``.
        queries: Query id -> query text, only the queries judged in this split.
        qrels: Query id -> {document id -> graded relevance (int, > 0 is relevant)}.
    """

    name: str
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def _field(obj: dict[str, Any], key: str, line: int, path: Path, *, required: bool) -> str:
    """Return ``obj[key]`` as text (integer ids are accepted and turned into text)."""
    value = obj.get(key)
    if value is None and not required:
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int):
        msg = f"field {key!r} must be a string, got {value!r:.60}"
        raise InvalidDocument(msg, line=line, source=str(path))
    return str(value)


def iter_corpus(path: Path) -> Iterator[CorpusDoc]:
    """Stream the documents of a BEIR corpus, one at a time, in file order.

    Args:
        path: A BEIR folder (its ``corpus.jsonl`` is read) or a ``corpus.jsonl`` file.

    Yields:
        ``{"_id", "title", "text", "metadata"}``; missing title -> ``""``, metadata -> ``{}``.

    Raises:
        InvalidRequest: The file does not exist.
        InvalidDocument: A line is not a JSON object, lacks ``_id``/``text`` or has a non-string
            field; the message names the file and 1-based line number.
    """
    corpus = path / "corpus.jsonl" if path.is_dir() else path
    for line_no, obj in read_jsonl(corpus):
        metadata = obj.get("metadata") or {}
        if not isinstance(metadata, dict):
            msg = "field 'metadata' must be an object"
            raise InvalidDocument(msg, line=line_no, source=str(corpus))
        yield CorpusDoc(
            _id=_field(obj, "_id", line_no, corpus, required=True),
            title=_field(obj, "title", line_no, corpus, required=False),
            text=_field(obj, "text", line_no, corpus, required=True),
            metadata=metadata,
        )


def load_queries(beir_dir: Path) -> dict[str, str]:
    """Load every query of ``<beir_dir>/queries.jsonl``.

    Args:
        beir_dir: The BEIR folder.

    Returns:
        Query id -> query text, in file order.

    Raises:
        InvalidRequest: ``queries.jsonl`` does not exist.
        InvalidDocument: A line is malformed or repeats a query id (file and line number in
            the message).
    """
    return read_queries(beir_dir / "queries.jsonl")


def read_queries(path: Path) -> dict[str, str]:
    """Load a queries file in BEIR's form (one ``{"_id", "text"}`` object a line).

    Returns:
        Query id -> query text, in file order.

    Raises:
        InvalidRequest: ``path`` does not exist.
        InvalidDocument: A line is malformed or repeats a query id (file and line named).
    """
    queries: dict[str, str] = {}
    for n, obj in read_jsonl(path):
        qid, text = _field(obj, "_id", n, path, required=True), _field(obj, "text", n, path, required=True)
        if qid in queries:
            raise InvalidDocument(f"duplicate query id {qid!r}", line=n, source=str(path))
        queries[qid] = text
    return queries


def list_splits(beir_dir: Path) -> list[str]:
    """Return the split names of a BEIR folder (stems of ``qrels/*.tsv``), sorted."""
    return sorted(p.stem for p in (beir_dir / "qrels").glob("*.tsv"))


def load_qrels(beir_dir: Path, split: str) -> dict[str, dict[str, int]]:
    """Load ``<beir_dir>/qrels/<split>.tsv``.

    Args:
        beir_dir: The BEIR folder.
        split: Split name, e.g. ``"test"``.

    Returns:
        Query id -> {document id -> relevance grade}.

    Raises:
        InvalidRequest: The split does not exist (the message lists the ones that do).
        InvalidDocument: The header is not ``query-id corpus-id score``, a row is malformed, or a
            (query, document) pair is judged twice.
    """
    path = beir_dir / "qrels" / f"{split}.tsv"
    if not path.is_file():
        available = list_splits(beir_dir)
        raise InvalidRequest(f"no split {split!r} in {beir_dir} ({path}); available: {available}")
    qrels: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8", newline="") as handle:
        rows = csv.reader(handle, delimiter="\t")
        header = next(rows, None)
        if header is None or tuple(h.strip() for h in header) != QRELS_HEADER:
            raise InvalidDocument(f"header must be {_HEADER_TEXT!r}", line=1, source=str(path))
        for line_no, row in enumerate(rows, start=2):
            if not row:
                continue
            if len(row) != 3:
                msg = f"expected 3 columns, got {len(row)}"
                raise InvalidDocument(msg, line=line_no, source=str(path))
            try:
                grade = int(row[2])
            except ValueError as exc:
                msg = f"score {row[2]!r} is not an integer"
                raise InvalidDocument(msg, line=line_no, source=str(path)) from exc
            judged = qrels.setdefault(row[0], {})
            if row[1] in judged:
                msg = f"query {row[0]!r} and document {row[1]!r} are judged twice (a later row would win)"
                raise InvalidDocument(msg, line=line_no, source=str(path))
            judged[row[1]] = grade
    return qrels


def load_split(beir_dir: Path, split: str) -> BeirSplit:
    """Load the queries and qrels of one split; only queries judged in the split are kept.

    Args:
        beir_dir: The BEIR folder.
        split: Split name, e.g. ``"test"``.

    Returns:
        The split, queries in qrels order.

    Raises:
        InvalidRequest: The folder, ``queries.jsonl`` or the split does not exist.
        InvalidDocument: A file is malformed, or a judged query is missing from ``queries.jsonl``.
    """
    qrels = load_qrels(beir_dir, split)
    all_queries = load_queries(beir_dir)
    missing = [qid for qid in qrels if qid not in all_queries]
    if missing:
        raise InvalidDocument(
            f"{len(missing)} judged queries are missing from queries.jsonl, e.g. {missing[:3]}",
            source=str(beir_dir / "qrels" / f"{split}.tsv"),
        )
    return BeirSplit(name=split, queries={qid: all_queries[qid] for qid in qrels}, qrels=qrels)


def select_queries(split: BeirSplit, *, max_queries: int | None = None, sample: int | None = None,
                   seed: int = 0) -> BeirSplit:
    """A smaller split for a quick run: its first ``max_queries`` queries, or ``sample`` of them at random.

    ``max_queries`` keeps the split's order (the qrels file's); ``sample`` draws without
    replacement with :class:`random.Random` seeded by ``seed`` over the query ids sorted, so the
    same seed gives the same queries on every machine, and runs of one seed pair query by query
    (``quarry eval compare``). A number at or over the split's size keeps every query.

    Raises:
        InvalidRequest: Both are given, or one is below 1.
    """
    if max_queries is not None and sample is not None:
        raise InvalidRequest("--max-queries and --sample choose the queries two ways: give one")
    n = max_queries if max_queries is not None else sample
    if n is None:
        return split
    if n < 1:
        raise InvalidRequest(f"{'--max-queries' if max_queries is not None else '--sample'} must be >= 1, got {n}")
    ids = list(split.queries)
    if max_queries is not None:
        kept = ids[:n]
    else:
        chosen = set(random.Random(seed).sample(sorted(ids), min(n, len(ids))))
        kept = [q for q in ids if q in chosen]
    return BeirSplit(split.name, {q: split.queries[q] for q in kept}, {q: split.qrels[q] for q in kept})
