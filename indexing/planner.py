"""Index planner: from vector count, dim and memory budget, choose the index and its parameters.

The planner is pure (no engine calls). It first picks the *ideal* index for the data size, then
the closest one the engine can actually build (``StoreCapabilities.index_kinds``), and records
why whenever the two differ.

Ideal choice, in order:

1. ``FLAT`` (exact search) below :data:`FLAT_MAX_VECTORS` vectors: a scan of 20k vectors costs
   well under a millisecond per query batch and gives recall 1.0.
2. ``HNSW`` while its RAM estimate fits the budget (``M`` 16..48 growing with dim and size,
   ``efConstruction`` 200, search ``ef`` >= 2·top_k, 64 up to 1M vectors, 128 beyond).
3. ``IVF_PQ`` when HNSW does not fit (``nlist`` ≈ 4·√n rounded to a power of two in
   [16, 65536]; PQ ``m`` dividing dim with dim/m in {2, 4, 8}, the least compression that fits;
   ``nbits`` 8; ``nprobe`` = nlist/64 for IVF_PQ, nlist/16 for IVF_FLAT, at least 8).
4. ``DISKANN`` when not even IVF_PQ fits: only PQ codes stay in RAM, the graph and the
   full-precision vectors live on SSD.

Fallback order when the ideal kind is not available: ``DISKANN → IVF_PQ → HNSW with
quantization → IVF_FLAT → FLAT`` (a plain ``HNSW`` ideal goes ``HNSW → HNSW with quantization
→ FLAT while cheap → IVF_FLAT → FLAT``; exact search is "cheap" up to
:data:`FLAT_FALLBACK_MAX_OPS` multiply-adds per query, about 10 ms on one core, where it beats
an approximate IVF_FLAT on recall at similar latency). "HNSW with quantization" is engine
specific: Qdrant keeps scalar (int8) or product-quantized vectors in RAM and the originals on
disk; pgvector builds HNSW on ``halfvec`` (dim <= 4000), halving vector memory. The first
available variant that fits the budget wins; when none fits, the first available one is
returned with ``fits=False``.

Memory formulas and parameter rules (``M``, ``ef``, ``nlist``, ``nprobe``, PQ ``m``):
:mod:`indexing.index_sizing`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from indexing import index_sizing as sizing
from quarry.errors import InvalidRequest, UnsupportedIndex
from stores.base import IndexKind, IndexSpec, Metric, StoreCapabilities

if TYPE_CHECKING:
    from stores.base import VectorStore

FLAT_MAX_VECTORS = 20_000
FLAT_FALLBACK_MAX_OPS = 50_000_000

# Option groups of the fallback chains; "HNSW_Q" = HNSW with engine-specific quantization.
_CHAINS: dict[IndexKind, tuple[str, ...]] = {
    "FLAT": ("FLAT", "HNSW"),
    "HNSW": ("HNSW", "HNSW_Q", "FLAT_CHEAP", "IVF_FLAT", "FLAT"),
    "IVF_PQ": ("IVF_PQ", "HNSW_Q", "IVF_FLAT", "FLAT"),
    "DISKANN": ("DISKANN", "IVF_PQ", "HNSW_Q", "IVF_FLAT", "FLAT"),
}


@dataclass(frozen=True)
class IndexPlan:
    """The planner's decision for one collection.

    Attributes:
        spec: The index to build (kind, build params, search params).
        ideal: The kind the data size calls for, before engine fallback.
        reason: Why the ideal kind was chosen (with the memory figures).
        fallback_reason: Why ``spec.kind`` differs from ``ideal`` (or why a quantized variant
            was needed); ``None`` when the ideal index was planned as is.
        estimated_bytes: RAM the chosen index needs, in bytes (see the module formulas).
        memory_budget_bytes: The budget the plan was made for, in bytes.
        fits: Whether ``estimated_bytes <= memory_budget_bytes``.
        n_vectors: Vectors planned for.
        dim: Their dimension.
        engine: ``capabilities.engine`` and ``version``, e.g. ``"milvus 2.3.5"``.
        server_config: Engine settings the plan relies on that cannot be passed per index
            (e.g. Milvus ``DiskIndex.PQCodeBudgetGBRatio``); empty when none.
    """

    spec: IndexSpec
    ideal: IndexKind
    reason: str
    fallback_reason: str | None
    estimated_bytes: int
    memory_budget_bytes: int
    fits: bool
    n_vectors: int
    dim: int
    engine: str
    server_config: dict[str, Any] = field(default_factory=dict)

    def explain(self) -> str:
        """One paragraph: what is built and why (the text shown in collection descriptions)."""
        text = f"{_describe_spec(self.spec)}. {self.reason}"
        if self.fallback_reason:
            text += f" {self.fallback_reason}"
        if not self.fits:
            text += (
                f" WARNING: needs {_gib(self.estimated_bytes)} of RAM, over the "
                f"{_gib(self.memory_budget_bytes)} budget; shard the collection or raise "
                "store.memory_budget_gib."
            )
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for ``quarry index plan --json`` and collection metadata)."""
        return {
            "engine": self.engine,
            "n_vectors": self.n_vectors,
            "dim": self.dim,
            "kind": self.spec.kind,
            "metric": self.spec.metric,
            "params": dict(self.spec.params),
            "search_params": dict(self.spec.search_params),
            "ideal": self.ideal,
            "reason": self.reason,
            "fallback_reason": self.fallback_reason,
            "estimated_bytes": self.estimated_bytes,
            "memory_budget_bytes": self.memory_budget_bytes,
            "fits": self.fits,
            "server_config": dict(self.server_config),
        }


@dataclass(frozen=True)
class _Ctx:
    n: int
    dim: int
    metric: Metric
    top_k: int
    budget: int
    caps: StoreCapabilities


@dataclass(frozen=True)
class _Candidate:
    spec: IndexSpec
    bytes: int
    label: str


# ---------------------------------------------------------------- candidates per option


def _hnsw(n: int, dim: int, metric: Metric, top_k: int) -> _Candidate:
    m = sizing.hnsw_m(n, dim)
    build = {"M": m, "efConstruction": sizing.EF_CONSTRUCTION}
    spec = IndexSpec("HNSW", metric, build, {"ef": sizing.hnsw_ef(n, top_k)})
    return _Candidate(spec, sizing.hnsw_bytes(n, dim, m), "HNSW")


def _ivf_pq(n: int, dim: int, metric: Metric, top_k: int) -> list[_Candidate]:
    nlist = sizing.ivf_nlist(n)
    out = []
    for m in sizing.pq_m_options(dim):
        params = {"nlist": nlist, "m": m, "nbits": sizing.PQ_NBITS}
        spec = IndexSpec("IVF_PQ", metric, params, {"nprobe": sizing.ivf_nprobe(nlist, top_k)})
        out.append(_Candidate(spec, sizing.ivf_pq_bytes(n, dim, nlist, m), f"IVF_PQ (m={m})"))
    return out


def _ivf_flat(  # noqa: PLR0913 - the data's shape and the engine's limits
    n: int, dim: int, metric: Metric, top_k: int, halfvec: bool, nlist_max: int = sizing.NLIST_MAX
) -> _Candidate:
    nlist = min(sizing.ivf_nlist(n), nlist_max)
    params: dict[str, Any] = {"nlist": nlist}
    if halfvec:
        params["halfvec"] = True
    spec = IndexSpec("IVF_FLAT", metric, params, {"nprobe": sizing.ivf_nprobe(nlist, top_k, 16)})
    size = sizing.ivf_flat_bytes(n, dim, nlist, 2 if halfvec else 4)
    return _Candidate(spec, size, "IVF_FLAT on halfvec" if halfvec else "IVF_FLAT")


def _diskann(n: int, dim: int, metric: Metric, top_k: int, budget: int) -> _Candidate:
    code = min(int(sizing.DISKANN_PQ_RATIO * 4 * dim), budget // max(n, 1))
    code = max(code, sizing.DISKANN_MIN_CODE_BYTES)
    spec = IndexSpec("DISKANN", metric, {}, {"search_list": sizing.diskann_search_list(top_k)})
    return _Candidate(spec, n * code, f"DISKANN ({code}-byte PQ codes in RAM)")


def _quantized_hnsw(n: int, dim: int, metric: Metric, top_k: int, engine: str) -> list[_Candidate]:
    base = _hnsw(n, dim, metric, top_k).spec
    m = int(base.params["M"])
    if engine.startswith(("pgvector", "postgres")):
        if dim > sizing.HALFVEC_MAX_DIM:
            return []
        spec = replace(base, params={**base.params, "halfvec": True})
        return [_Candidate(spec, sizing.hnsw_bytes(n, dim, m, 2), "HNSW on halfvec")]
    if not engine.startswith("qdrant"):
        return []
    return _qdrant_quantized(n, dim, metric, base)


def _qdrant_quantized(n: int, dim: int, metric: Metric, base: IndexSpec) -> list[_Candidate]:
    """Qdrant HNSW over int8/PQ codes in RAM; ``on_disk`` puts the originals and graph on disk."""
    search = {**base.search_params, "rescore": True, "oversampling": 2.0}
    options: list[tuple[dict[str, Any], int, str]] = [({"quantization": "scalar"}, dim, "int8 scalar quantization")]
    for x in sizing.QDRANT_PQ_COMPRESSIONS:
        code = max(4 * dim // x, 1)
        options.append(({"quantization": "product", "compression": f"x{x}"}, code, f"product quantization x{x}"))
    return [
        _Candidate(
            IndexSpec("HNSW", metric, {**base.params, **quant, "on_disk": True}, search),
            sizing.quantized_hnsw_bytes(n, code, int(base.params["M"]), graph_on_disk=True),
            f"HNSW + {label} (vectors and graph on disk)",
        )
        for quant, code, label in options
    ]


def _option(group: str, ctx: _Ctx) -> list[_Candidate]:
    n, dim, metric, top_k = ctx.n, ctx.dim, ctx.metric, ctx.top_k
    kinds = ctx.caps.index_kinds
    too_wide = ctx.caps.max_dim is not None and dim > ctx.caps.max_dim
    if group == "FLAT_CHEAP" and n * dim > FLAT_FALLBACK_MAX_OPS:
        return []
    if group in ("FLAT", "FLAT_CHEAP"):
        label = "FLAT (exact)"
        if group == "FLAT_CHEAP":
            label = f"FLAT (exact: {n * dim / 1e6:.1f}M multiply-adds per query, recall 1.0)"
        flat = IndexSpec("FLAT", metric)
        return [_Candidate(flat, sizing.flat_bytes(n, dim), label)] if "FLAT" in kinds else []
    if group == "HNSW_Q":
        return _quantized_hnsw(n, dim, metric, top_k, ctx.caps.engine) if "HNSW" in kinds else []
    if group not in kinds:
        return []
    pg = ctx.caps.engine.startswith(("pgvector", "postgres"))
    halfvec = pg and dim <= sizing.HALFVEC_MAX_DIM
    if group == "IVF_FLAT" and (halfvec or not too_wide):
        nlist_max = sizing.PGVECTOR_MAX_LISTS if pg else sizing.NLIST_MAX
        return [_ivf_flat(n, dim, metric, top_k, halfvec=too_wide, nlist_max=nlist_max)]
    if too_wide:
        return []
    if group == "HNSW":
        return [_hnsw(n, dim, metric, top_k)]
    if group == "IVF_PQ":
        return _ivf_pq(n, dim, metric, top_k)
    return [_diskann(n, dim, metric, top_k, ctx.budget)]


# ---------------------------------------------------------------- the ideal kind


def _ideal(ctx: _Ctx) -> tuple[IndexKind, str]:
    n, dim, budget = ctx.n, ctx.dim, ctx.budget
    if n < FLAT_MAX_VECTORS:
        return "FLAT", (
            f"{n:,} vectors < {FLAT_MAX_VECTORS:,}: exact search is fast enough and has recall 1.0 "
            f"({_gib(sizing.flat_bytes(n, dim))})."
        )
    hnsw = _hnsw(n, dim, ctx.metric, ctx.top_k)
    if hnsw.bytes <= budget:
        return "HNSW", f"HNSW fits the budget: {_gib(hnsw.bytes)} <= {_gib(budget)}."
    why_not_hnsw = f"HNSW would need {_gib(hnsw.bytes)} > {_gib(budget)} budget"
    for pq in _ivf_pq(n, dim, ctx.metric, ctx.top_k):
        if pq.bytes <= budget:
            return "IVF_PQ", f"{why_not_hnsw}; {pq.label} fits with {_gib(pq.bytes)}."
    smallest = _ivf_pq(n, dim, ctx.metric, ctx.top_k)[-1] if sizing.pq_m_options(dim) else hnsw
    return "DISKANN", (
        f"{why_not_hnsw} and {smallest.label} {_gib(smallest.bytes)}; DiskANN keeps only "
        "PQ codes in RAM (graph and vectors on SSD)."
    )


def _pick(ctx: _Ctx, ideal: IndexKind) -> tuple[_Candidate, str, str | None]:
    """First available candidate that fits along the fallback chain (else the first available).

    Returns the candidate, its option group and a note when nothing fits.
    """
    first_available: tuple[_Candidate, str] | None = None
    for group in _CHAINS[ideal]:
        options = _option(group, ctx)
        for cand in options:
            if cand.bytes <= ctx.budget:
                return cand, group, None
        if options and first_available is None:
            first_available = (options[-1], group)
    if first_available is None:
        raise UnsupportedIndex(
            f"{ctx.caps.engine} {ctx.caps.version} declares no index kind the planner can use "
            f"(declared: {sorted(ctx.caps.index_kinds)})"
        )
    return *first_available, "none of the available indexes fits the budget"


def _fallback_reason(ctx: _Ctx, ideal: IndexKind, chosen: _Candidate, group: str, note: str | None) -> str | None:
    engine = f"{ctx.caps.engine} {ctx.caps.version}"
    if group == ideal and note is None:
        return None
    if ideal in ctx.caps.index_kinds and not _too_wide(ctx, ideal):
        cause = f"{ideal} on {engine} does not fit the budget"
    elif _too_wide(ctx, ideal):
        cause = f"{engine} cannot index {ctx.dim}-dim vectors with {ideal} (max {ctx.caps.max_dim})"
    else:
        cause = f"{engine} cannot build {ideal}"
    text = f"{cause}; using {chosen.label}, the closest available ({_gib(chosen.bytes)})."
    if note:
        text += f" Note: {note}."
    return text


def _too_wide(ctx: _Ctx, kind: IndexKind) -> bool:
    return kind != "FLAT" and ctx.caps.max_dim is not None and ctx.dim > ctx.caps.max_dim


def _server_config(chosen: _Candidate, n: int, dim: int) -> dict[str, Any]:
    if chosen.spec.kind != "DISKANN":
        return {}
    ratio = chosen.bytes / max(sizing.flat_bytes(n, dim), 1)
    return {
        "DiskIndex.PQCodeBudgetGBRatio": round(ratio, 4),
        "DiskIndex.SearchCacheBudgetGBRatio": 0.0,
    }


# ---------------------------------------------------------------- public API


def plan_index(
    n_vectors: int,
    dim: int,
    capabilities: StoreCapabilities,
    memory_budget_bytes: int,
    metric: Metric = "cosine",
    *,
    top_k: int = 10,
) -> IndexPlan:
    """Choose the index kind and parameters for a collection.

    Args:
        n_vectors: Vectors the collection will hold (planned size, not necessarily current).
        dim: Vector dimension.
        capabilities: What the engine can build (``VectorStore.capabilities()``).
        memory_budget_bytes: RAM the index may use, in bytes (``StoreSettings.memory_budget_gib``
            times :data:`sizing.GIB`).
        metric: Distance the index is built for.
        top_k: Typical hits per query; search ``ef``/``nprobe``/``search_list`` are at least this.

    Returns:
        The plan: the spec to pass to ``VectorStore.build_index``, the ideal kind, the reasons
        and the memory estimate.

    Raises:
        InvalidRequest: ``n_vectors < 0``, ``dim < 1``, ``top_k < 1`` or a budget <= 0.
        UnsupportedIndex: The engine declares no index kind at all the planner can use.
    """
    if n_vectors < 0 or dim < 1 or top_k < 1 or memory_budget_bytes <= 0:
        raise InvalidRequest(
            f"cannot plan an index for n_vectors={n_vectors}, dim={dim}, top_k={top_k}, "
            f"memory_budget_bytes={memory_budget_bytes}: all must be positive (n may be 0)"
        )
    ctx = _Ctx(n_vectors, dim, metric, top_k, memory_budget_bytes, capabilities)
    ideal, reason = _ideal(ctx)
    chosen, group, note = _pick(ctx, ideal)
    fallback = _fallback_reason(ctx, ideal, chosen, group, note)
    return IndexPlan(
        spec=chosen.spec,
        ideal=ideal,
        reason=reason,
        fallback_reason=fallback,
        estimated_bytes=chosen.bytes,
        memory_budget_bytes=memory_budget_bytes,
        fits=chosen.bytes <= memory_budget_bytes,
        n_vectors=n_vectors,
        dim=dim,
        engine=f"{capabilities.engine} {capabilities.version}".strip(),
        server_config=_server_config(chosen, n_vectors, dim),
    )


def plan_for_store(
    store: VectorStore,
    n_vectors: int,
    dim: int,
    memory_budget_bytes: int,
    metric: Metric = "cosine",
    *,
    top_k: int = 10,
) -> IndexPlan:
    """:func:`plan_index` with the capabilities of an open store.

    Raises:
        InvalidRequest: See :func:`plan_index`.
        UnsupportedIndex: See :func:`plan_index`.
        StoreUnavailable: The store cannot be reached to read its capabilities.
    """
    return plan_index(n_vectors, dim, store.capabilities(), memory_budget_bytes, metric, top_k=top_k)


def plan_kind(
    kind: str,
    n_vectors: int,
    dim: int,
    capabilities: StoreCapabilities,
    memory_budget_bytes: int,
    metric: Metric = "cosine",
    *,
    top_k: int = 10,
) -> IndexSpec:
    """The planner's parameters for an index kind asked for by name (``quarry reindex --index hnsw``).

    The kind is built with what :func:`plan_index` would give it for this size and engine:
    ``nlist``/``nprobe`` for IVF (pgvector's ``lists`` capped at 32,768), ``M``,
    ``efConstruction`` and ``ef`` for HNSW (on pgvector over ``halfvec``, or on Qdrant over
    quantized vectors, when plain HNSW cannot index ``dim`` or does not fit), PQ ``m`` for
    IVF_PQ (the least compression that fits), ``search_list`` for DiskANN.

    Args:
        kind: ``flat``, ``hnsw``, ``ivf_flat``, ``ivf_pq`` or ``diskann`` (any case).
        n_vectors: Vectors the index is built for.
        dim: Their dimension.
        capabilities: The engine's (``VectorStore.capabilities()``).
        memory_budget_bytes: The RAM budget, in bytes.
        metric: Distance the index is built for.
        top_k: Candidates a query asks for (the searcher's depth).

    Returns:
        The index spec: the first variant that fits the budget, else the smallest one.

    Raises:
        InvalidRequest: See :func:`plan_index`.
        UnsupportedIndex: ``kind`` is not an index kind, or the engine cannot build it for ``dim``.
    """
    if n_vectors < 0 or dim < 1 or top_k < 1 or memory_budget_bytes <= 0:
        raise InvalidRequest(
            f"cannot plan an index for n_vectors={n_vectors}, dim={dim}, top_k={top_k}, "
            f"memory_budget_bytes={memory_budget_bytes}: all must be positive (n may be 0)"
        )
    wanted = kind.strip().upper()
    engine = f"{capabilities.engine} {capabilities.version}".strip()
    if wanted not in _CHAINS and wanted != "IVF_FLAT":
        raise UnsupportedIndex(f"unknown index kind {kind!r}; one of auto, flat, hnsw, ivf_flat, ivf_pq, diskann")
    ctx = _Ctx(n_vectors, dim, metric, top_k, memory_budget_bytes, capabilities)
    groups = ("HNSW", "HNSW_Q") if wanted == "HNSW" else (wanted,)
    options = [cand for group in groups for cand in _option(group, ctx)]
    if not options:
        reason = f"on {dim}-dim vectors" if wanted in capabilities.index_kinds else "indexes"
        raise UnsupportedIndex(
            f"{engine} cannot build {wanted} {reason}; it can build {', '.join(sorted(capabilities.index_kinds))}"
        )
    fitting = [cand for cand in options if cand.bytes <= memory_budget_bytes]
    return fitting[0].spec if fitting else options[-1].spec


def ensure_buildable(spec: IndexSpec, capabilities: StoreCapabilities, dim: int) -> None:
    """Fail fast when an engine cannot build ``spec`` (stores call this before any work).

    Args:
        spec: The requested index.
        capabilities: The engine's declared capabilities.
        dim: The collection's dimension.

    Raises:
        UnsupportedIndex: ``spec.kind`` is not declared, or ``dim`` exceeds ``max_dim`` (a
            pgvector ``halfvec`` index may go up to 4000 dims).
    """
    engine = f"{capabilities.engine} {capabilities.version}".strip()
    if spec.kind not in capabilities.index_kinds:
        raise UnsupportedIndex(
            f"{engine} cannot build a {spec.kind} index; it can build {', '.join(sorted(capabilities.index_kinds))}"
        )
    limit = sizing.HALFVEC_MAX_DIM if spec.params.get("halfvec") else capabilities.max_dim
    if spec.kind != "FLAT" and limit is not None and dim > limit:
        raise UnsupportedIndex(f"{engine} cannot build {spec.kind} on {dim}-dim vectors (at most {limit})")


def format_plan(plan: IndexPlan) -> str:
    """A small aligned text block for the CLI (``quarry index plan``)."""
    rows = [
        ("engine", plan.engine),
        ("vectors", f"{plan.n_vectors:,} x {plan.dim} ({plan.spec.metric})"),
        ("ideal", f"{plan.ideal}: {plan.reason}"),
        ("chosen", _describe_spec(plan.spec)),
        (
            "memory",
            f"{_gib(plan.estimated_bytes)} of {_gib(plan.memory_budget_bytes)} "
            f"({'fits' if plan.fits else 'DOES NOT FIT'})",
        ),
    ]
    if plan.fallback_reason:
        rows.append(("fallback", plan.fallback_reason))
    if plan.server_config:
        rows.append(("config", ", ".join(f"{k}={v}" for k, v in plan.server_config.items())))
    return "\n".join(f"{key:<9} {value}" for key, value in rows)


def _describe_spec(spec: IndexSpec) -> str:
    build = ", ".join(f"{k}={v}" for k, v in spec.params.items())
    search = ", ".join(f"{k}={v}" for k, v in spec.search_params.items())
    text = spec.kind + (f" ({build})" if build else "")
    return text + (f"; search {search}" if search else "")


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / sizing.GIB:.1f} GiB" if n_bytes >= sizing.GIB / 10 else f"{n_bytes / (1 << 20):.1f} MiB"
