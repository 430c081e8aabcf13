"""Filtered recall by filter form: one dataset, the same rows selected in every form.

Used by ``tests/stores/test_filtered_recall.py`` (the contract) and ``bench/filtered_recall.py``
(recall and latency per form). The data: ``n`` random unit vectors of ``dim`` dims whose rows are
ranked by a random permutation; row ``i`` with rank ``r`` carries

* ``b``: ``r // 2`` (int, 2 rows per value),
* ``g01``: ``r // 20`` (int) and ``s01``: ``"b<r // 20>"`` (string), 20 rows per value,
* ``g1``: ``r // 200`` (int) and ``s1``: ``"c<r // 200>"`` (string), 200 rows per value.

With ``n = 20,000`` the rows of rank ``< 20`` are 0.1 % of the collection and those of rank
``< 200`` are 1 %; :func:`selections` writes each set as an equality on a string, an equality on
a number, a ``$in`` of numbers, a numeric range and an ``$or`` of equalities. Ground truth is
numpy brute force over the matching rows (:func:`exact_top`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stores.base import IndexSpec, Metric, Payload, VectorRecord
from stores.filters import Eq, Filter, In, Or, Range

GROUP_SMALL = 20  # rows per ``s01``/``g01`` value
GROUP_LARGE = 200  # rows per ``s1`` value
FORMS = ("eq_str", "eq_int", "in", "range", "or")


@dataclass(frozen=True)
class Selection:
    """One set of rows written as one filter form.

    Attributes:
        level: Share of the collection the filter selects, e.g. ``"1%"``.
        form: One of :data:`FORMS`.
        flt: The typed filter.
        rows: Row numbers that match, ascending.
    """

    level: str
    form: str
    flt: Filter
    rows: npt.NDArray[np.int64]


@dataclass(frozen=True)
class FilteredData:
    """The vectors, the rank of every row and the queries.

    Attributes:
        vectors: ``(n, dim) float32``, L2-normalised.
        rank: ``(n,) int64``: the permutation the payload fields derive from.
        queries: ``(q, dim) float32``, L2-normalised.
    """

    vectors: npt.NDArray[np.float32]
    rank: npt.NDArray[np.int64]
    queries: npt.NDArray[np.float32]

    def payload(self, row: int) -> Payload:
        """The payload of one row (see the module docstring)."""
        r = int(self.rank[row])
        small, large = r // GROUP_SMALL, r // GROUP_LARGE
        return {"b": r // 2, "g01": small, "s01": f"b{small}", "g1": large, "s1": f"c{large}"}

    def records(self, start: int = 0, stop: int | None = None) -> list[VectorRecord]:
        """Records ``start..stop`` with ids ``"r<row>"``."""
        stop = len(self.vectors) if stop is None else stop
        return [VectorRecord(f"r{i}", self.vectors[i], self.payload(i)) for i in range(start, stop)]


def _unit(rng: np.random.Generator, n: int, dim: int) -> npt.NDArray[np.float32]:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return np.asarray(x / np.linalg.norm(x, axis=1, keepdims=True), dtype=np.float32)


def make_data(n: int = 20_000, dim: int = 32, n_queries: int = 50, seed: int = 20) -> FilteredData:
    """Random unit vectors and queries (``n`` a multiple of 200 keeps the groups whole)."""
    rng = np.random.default_rng(seed)
    vectors = _unit(rng, n, dim)
    rank = rng.permutation(n).astype(np.int64)
    return FilteredData(vectors, rank, _unit(rng, n_queries, dim))


def selections(data: FilteredData) -> list[Selection]:
    """The 0.1 % (rank < 20) and 1 % (rank < 200) sets, each in every form of :data:`FORMS`.

    For the 1 % set the ``$in`` has 100 values and the ``$or`` ten string equalities; for the
    0.1 % set ten values and ten numeric equalities.
    """
    n = len(data.rank)
    out: list[Selection] = []
    for size, field in ((GROUP_SMALL, "01"), (GROUP_LARGE, "1")):
        rows = np.flatnonzero(data.rank < size)
        half = size // 2
        forms: dict[str, Filter] = {
            "eq_str": Eq(f"s{field}", "b0" if field == "01" else "c0"),
            "eq_int": Eq(f"g{field}", 0),
            "in": In("b", tuple(range(half))),
            "range": Range("b", gte=0, lt=half),
            # 0.1 %: ten numeric equalities; 1 %: ten string equalities of the 0.1 % groups
            "or": Or(tuple(Eq("b", v) for v in range(half)))
            if size == GROUP_SMALL
            else Or(tuple(Eq("s01", f"b{v}") for v in range(size // GROUP_SMALL))),
        }
        out.extend(Selection(f"{100 * size / n:g}%", form, forms[form], rows) for form in FORMS)
    return out


def exact_top(
    data: FilteredData, rows: npt.NDArray[np.int64], k: int, metric: Metric = "cosine"
) -> npt.NDArray[np.int64]:
    """``(q, min(k, len(rows)))`` row numbers of the exact top-k among ``rows`` per query."""
    sub = data.vectors[rows]
    if metric == "l2":
        scores = -np.linalg.norm(data.queries[:, None, :] - sub[None, :, :], axis=2)
    else:
        scores = data.queries @ sub.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.asarray(rows[order], dtype=np.int64)


def recall(found: list[list[str]], truth: npt.NDArray[np.int64]) -> float:
    """Mean recall@k of hit ids ``"r<row>"`` against :func:`exact_top` rows."""
    per_query = [
        len({int(i[1:]) for i in ids} & set(want.tolist())) / len(want) for ids, want in zip(found, truth, strict=True)
    ]
    return float(np.mean(per_query))


def ann_spec(kinds: frozenset[str], engine: str) -> IndexSpec:
    """An ANN index every engine walks at this size: HNSW where built, else IVF_FLAT.

    The planner picks ``FLAT`` below 20k vectors and Qdrant scans segments under its full-scan
    threshold (10 MB, 78k vectors of dim 32) exactly, so the index is forced: HNSW ``M`` 16,
    ``efConstruction`` 100, ``ef`` 64 (Qdrant with a 10 KiB full-scan threshold, 80 vectors),
    or IVF_FLAT ``nlist`` 128, ``nprobe`` 8 (Milvus Lite, which builds no HNSW).
    """
    if "HNSW" in kinds:
        params: dict[str, object] = {"M": 16, "efConstruction": 100}
        if engine.startswith("qdrant"):
            params["full_scan_threshold_kb"] = 10
        return IndexSpec("HNSW", "cosine", params, {"ef": 64})
    return IndexSpec("IVF_FLAT", "cosine", {"nlist": 128}, {"nprobe": 8})
