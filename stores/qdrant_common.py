"""Helpers shared by the Qdrant stores: name, shape and vector checks, atomic files, versions."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from quarry.errors import (
    ConfigError,
    DimensionMismatch,
    InvalidQuery,
    InvalidRequest,
)
from stores.base import (
    FloatMatrix,
    IndexKind,
    VectorRecord,
)

KINDS: frozenset[IndexKind] = frozenset({"FLAT", "HNSW"})

MAX_DIM = 65_536
NAME = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
BATCH = 1000
NOTES = (
    "HNSW (M, efConstruction, search ef) plus optional int8 scalar or product quantization "
    "(params quantization='int8'|'pq', compression='x4'..'x64'); FLAT = exact search; no IVF or "
    "DiskANN; segments under full_scan_threshold_kb (default 10000 KiB) are searched exactly"
)



def abs_path(path: str, url: str) -> Path:
    """The absolute path of a ``qdrant:///abs`` URL (ConfigError otherwise)."""
    if not path.startswith("/"):
        raise ConfigError(f"{url!r} must name an absolute path, e.g. qdrant:///var/lib/quarry")
    return Path(path)


def check_name(name: str) -> None:
    """Reject collection/alias names Qdrant cannot hold (InvalidRequest)."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidRequest(f"invalid name {name!r}: use 1-128 letters, digits, '_', '-', '.'")


def check_shape(name: str, dim: int, metric: str) -> None:
    """Reject a bad collection name, dimension or metric (InvalidRequest)."""
    check_name(name)
    if not 1 <= dim <= MAX_DIM or metric not in ("cosine", "ip", "l2"):
        raise InvalidRequest(f"bad collection shape: dim={dim}, metric={metric!r}")


def check_vectors(records: Sequence[VectorRecord], dim: int, name: str) -> None:
    """Reject records whose vector is not ``(dim,)`` (DimensionMismatch) before writing."""
    for rec in records:
        shape = np.shape(rec.vector)
        if len(shape) != 1 or shape[0] != dim:
            got = shape[-1] if shape else 0
            raise DimensionMismatch(expected=dim, got=int(got), collection=name)


def check_queries(queries: FloatMatrix, top_k: int, dim: int, name: str) -> FloatMatrix:
    """``(n, dim) float32`` queries, or InvalidQuery / DimensionMismatch."""
    arr = np.asarray(queries, dtype=np.float32)
    if arr.ndim != 2:
        raise InvalidQuery(f"queries must be an (n, dim) matrix, got shape {arr.shape}")
    if arr.shape[1] != dim:
        raise DimensionMismatch(expected=dim, got=int(arr.shape[1]), collection=name)
    if top_k < 1:
        raise InvalidQuery(f"top_k must be >= 1, got {top_k}")
    return arr


def atomic_json(path: Path, data: Any) -> None:
    """Write JSON to ``path`` atomically (temp file, fsync, rename)."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def package_version(dist: str) -> str:
    """Installed version of a distribution, or ``"unknown"``."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - not installed
        return "unknown"


# --------------------------------------------------------------------------------------------
# qdrant-edge: the engine in process
# --------------------------------------------------------------------------------------------
