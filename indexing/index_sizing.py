"""Index sizing: memory formulas and parameter rules the planner (:mod:`indexing.planner`) applies.

Pure functions of the vector count ``n``, dimension ``d`` and ``top_k``.

Memory formulas (bytes, ``n`` vectors of dimension ``d``):

=================  ==========================================================================
FLAT               ``n·d·4`` (raw float32)
HNSW               ``n·(d·b + 2·M·4)``, ``b`` = 4 (float32) or 2 (halfvec). Faiss wiki,
                   "Guidelines to choose an index": IndexHNSWFlat uses ``(d·4 + M·2·4)``
                   bytes per vector (level-0 links dominate).
HNSW + SQ/PQ       ``n·c`` with ``c`` the quantized code (``d`` bytes for int8 SQ, ``4·d/x``
                   for PQ ``x``-fold): Qdrant with ``on_disk`` keeps the original vectors
                   and the graph on disk and the codes in RAM (Qdrant "Quantization" and
                   "Storage" docs); ``n·(c + 2·M·4)`` when the graph stays in RAM.
IVF_FLAT           ``n·(d·b + 8) + nlist·d·4`` (vectors, 8-byte ids, centroids).
IVF_PQ             ``n·(m·nbits/8 + 8) + nlist·d·4`` (Faiss wiki: IndexIVFPQ code size + 8
                   bytes per vector for the id; plus coarse centroids).
DISKANN            ``n·c``, ``c = min(0.125·4·d, budget/n)`` bytes of PQ code per vector;
                   Milvus' default ``DiskIndex.PQCodeBudgetGBRatio`` is 0.125 of raw size,
                   allowed (0, 0.25]. A code under 32 bytes is not planned (DiskANN,
                   Subramanya et al., NeurIPS 2019, serves 1B points with ~32-byte codes).
=================  ==========================================================================
"""

from __future__ import annotations

import math

GIB = 1 << 30
EF_CONSTRUCTION = 200
PQ_NBITS = 8
PQ_SUBVECTOR_DIMS = (2, 4, 8)
NLIST_MIN, NLIST_MAX = 16, 65_536
ID_BYTES = 8
DISKANN_PQ_RATIO = 0.125
DISKANN_MIN_CODE_BYTES = 32
HALFVEC_MAX_DIM = 4000
PGVECTOR_MAX_LISTS = 32_768
QDRANT_PQ_COMPRESSIONS = (8, 16, 32, 64)


# ---------------------------------------------------------------- memory formulas (bytes)


def flat_bytes(n: int, dim: int) -> int:
    """RAM of exact search over raw float32 vectors: ``n·d·4``."""
    return n * dim * 4


def hnsw_bytes(n: int, dim: int, m: int, bytes_per_value: int = 4) -> int:
    """RAM of HNSW with full vectors: ``n·(d·b + 2·M·4)`` (Faiss wiki rule of thumb)."""
    return n * (dim * bytes_per_value + 2 * m * 4)


def quantized_hnsw_bytes(n: int, code_bytes: int, m: int, graph_on_disk: bool = False) -> int:
    """RAM of HNSW over quantized codes (originals on disk): ``n·(c + 2·M·4)``, or ``n·c``."""
    return n * (code_bytes + (0 if graph_on_disk else 2 * m * 4))


def ivf_flat_bytes(n: int, dim: int, nlist: int, bytes_per_value: int = 4) -> int:
    """RAM of IVF_FLAT: ``n·(d·b + 8) + nlist·d·4``."""
    return n * (dim * bytes_per_value + ID_BYTES) + nlist * dim * 4


def ivf_pq_bytes(n: int, dim: int, nlist: int, m: int, nbits: int = PQ_NBITS) -> int:
    """RAM of IVF_PQ: ``n·(m·nbits/8 + 8) + nlist·d·4`` (Faiss wiki)."""
    return n * (m * nbits // 8 + ID_BYTES) + nlist * dim * 4


# ---------------------------------------------------------------- parameter rules


def hnsw_m(n: int, dim: int) -> int:
    """HNSW ``M``: 16 up to dim 128, 24 up to 512, 32 up to 1024, else 48; +8 from 10M vectors.

    Larger ``M`` keeps recall at high dimension and size (hnswlib ALGO_PARAMS.md: "M 12-48 is
    fine for most use cases; higher M for high intrinsic dimensionality").
    """
    m = 16 if dim <= 128 else 24 if dim <= 512 else 32 if dim <= 1024 else 48
    if n >= 10_000_000:
        m += 8
    return min(m, 48)


def hnsw_ef(n: int, top_k: int) -> int:
    """Search ``ef``: 64 up to 1M vectors, 128 beyond, and never below ``2·top_k``."""
    return max(2 * top_k, 64 if n <= 1_000_000 else 128)


def ivf_nlist(n: int) -> int:
    """``nlist`` ≈ 4·√n rounded (in log scale) to a power of two, clipped to [16, 65536]."""
    if n <= 0:
        return NLIST_MIN
    power = round(math.log2(4 * math.sqrt(n)))
    return int(min(max(2**power, NLIST_MIN), NLIST_MAX))


def ivf_nprobe(nlist: int, top_k: int, fraction: int = 64) -> int:
    """``nprobe`` = nlist/``fraction`` (64 for IVF_PQ, 16 for IVF_FLAT), at least 8 and ``top_k``.

    Faiss wiki ("Faster search"): nprobe trades speed for accuracy; nlist/64..nlist/16 keeps
    recall@10 high for well-clustered data while scanning 1.5-6 % of the lists.
    """
    return min(nlist, max(8, top_k, nlist // fraction))


def pq_m_options(dim: int) -> list[int]:
    """PQ ``m`` values with dim/m in {2, 4, 8}, least compression first (m always divides dim)."""
    return [dim // sub for sub in PQ_SUBVECTOR_DIMS if dim % sub == 0]


def diskann_search_list(top_k: int) -> int:
    """Milvus DiskANN ``search_list``: 100, within Milvus 2.3's [k, 200] (k <= 20) / [k, 10k]."""
    upper = 200 if top_k <= 20 else min(10 * top_k, 65_535)
    return min(max(100, top_k), upper)
