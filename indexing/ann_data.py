"""Readers for the texmex ``fvecs``/``ivecs`` format and the recall@k metric.

The texmex format (SIFT1M, SIFT10K, ``../shared/data/glove-50-angular-100k``) stores each vector
as a little-endian ``int32`` dimension ``d`` followed by ``d`` values (``float32`` for fvecs,
``int32`` for ivecs). Source: http://corpus-texmex.irisa.fr/ (format description).

The readers memory-map the file, so loading the 100k x 50 GloVe base costs no copy until the
rows are touched. Used by ``bench/stores.py`` and ``tests/stores/test_glove_recall.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from quarry.errors import ConfigError


def _read_vecs(path: Path, dtype: type[np.float32] | type[np.int32]) -> npt.NDArray[np.generic]:
    raw = np.memmap(path, dtype="<i4", mode="r")
    if raw.size == 0:
        return np.empty((0, 0), dtype=dtype)
    dim = int(raw[0])
    row = dim + 1
    if dim <= 0 or raw.size % row:
        raise ConfigError(f"{path}: not a texmex vecs file (dim {dim}, {raw.size * 4} bytes)")
    table = raw.reshape(-1, row)
    if not np.all(table[:, 0] == dim):
        raise ConfigError(f"{path}: rows have differing dimensions; expected {dim} throughout")
    return table[:, 1:].view(dtype)


def read_fvecs(path: str | Path) -> npt.NDArray[np.float32]:
    """Read an ``.fvecs`` file.

    Args:
        path: File in texmex format with ``float32`` values.

    Returns:
        ``(n, dim) float32``, a read-only memory-mapped view (copy it to modify).

    Raises:
        ConfigError: The file is not a valid fvecs file.
    """
    return _read_vecs(Path(path), np.float32).view(np.float32)


def read_ivecs(path: str | Path) -> npt.NDArray[np.int32]:
    """Read an ``.ivecs`` file (e.g. ground-truth neighbour ids).

    Args:
        path: File in texmex format with ``int32`` values.

    Returns:
        ``(n, k) int32``, a read-only memory-mapped view.

    Raises:
        ConfigError: The file is not a valid ivecs file.
    """
    return _read_vecs(Path(path), np.int32).view(np.int32)


def l2_normalise(vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Return an L2-normalised ``float32`` copy (rows of norm 0 stay 0), for cosine search.

    Args:
        vectors: ``(n, dim)`` array.

    Returns:
        ``(n, dim) float32`` with unit rows.
    """
    out = np.array(vectors, dtype=np.float32, copy=True)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out


def recall_at_k(found: npt.NDArray[np.int64], truth: npt.NDArray[np.integer[Any]], k: int) -> float:
    """Mean recall@k: the share of each query's true top-``k`` that the search returned.

    Args:
        found: ``(n_queries, >=k)`` returned row ids, best first; ``-1`` pads missing hits.
        truth: ``(n_queries, >=k)`` exact neighbour ids, nearest first.
        k: Cut-off.

    Returns:
        Recall in ``[0, 1]`` averaged over queries (ann-benchmarks' definition without the
        distance tie tolerance).
    """
    hits = 0
    for got, want in zip(found[:, :k], truth[:, :k], strict=True):
        hits += len(set(got.tolist()) & set(want.tolist()))
    return hits / (k * len(truth))


def exact_top_k(base: npt.NDArray[np.float32], queries: npt.NDArray[np.float32], k: int) -> npt.NDArray[np.int64]:
    """Exact inner-product top-``k`` by brute force (cosine when both sides are normalised).

    Args:
        base: ``(n, dim) float32``.
        queries: ``(q, dim) float32``.
        k: Neighbours per query; fewer columns come back when ``n < k``.

    Returns:
        ``(q, min(k, n)) int64`` row ids into ``base``, best first.
    """
    k = min(k, len(base))
    scores = queries @ base.T
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.take_along_axis(scores, part, axis=1).argsort(axis=1)[:, ::-1]
    return np.take_along_axis(part, order, axis=1).astype(np.int64)


@dataclass(frozen=True)
class AnnDataset:
    """A texmex-format ANN benchmark loaded for cosine search.

    Attributes:
        base: ``(n, dim) float32``, L2-normalised.
        queries: ``(q, dim) float32``, L2-normalised.
        groundtruth: ``(q, k_gt) int32`` exact neighbour ids into ``base``, nearest first.
    """

    base: npt.NDArray[np.float32]
    queries: npt.NDArray[np.float32]
    groundtruth: npt.NDArray[np.int32]

    @property
    def dim(self) -> int:
        """Vector dimension."""
        return int(self.base.shape[1])


def load_ann_dataset(directory: str | Path, n_base: int | None = None) -> AnnDataset:
    """Load ``base.fvecs``, ``query.fvecs`` and ``groundtruth.ivecs`` from a directory.

    Args:
        directory: E.g. ``../shared/data/glove-50-angular-100k``.
        n_base: Keep only the first ``n_base`` base rows (for quick runs). The stored ground
            truth then no longer applies, so it is recomputed exactly (top-100) on the subset.

    Returns:
        The normalised dataset.

    Raises:
        ConfigError: A file is missing or malformed.
    """
    root = Path(directory)
    for name in ("base.fvecs", "query.fvecs", "groundtruth.ivecs"):
        if not (root / name).is_file():
            raise ConfigError(f"{root}: missing {name}")
    base = l2_normalise(read_fvecs(root / "base.fvecs"))
    queries = l2_normalise(read_fvecs(root / "query.fvecs"))
    truth = np.asarray(read_ivecs(root / "groundtruth.ivecs"))
    if n_base is not None and n_base < len(base):
        base = base[:n_base].copy()
        truth = exact_top_k(base, queries, truth.shape[1]).astype(np.int32)
    return AnnDataset(base=base, queries=queries, groundtruth=truth)
