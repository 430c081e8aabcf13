r"""SQL building for the pgvector backend: names, typed filters, index DDL and search.

Every value reaches PostgreSQL as a bound parameter. Identifiers (schema, table and index names)
are validated against :data:`COLLECTION_NAME` and always quoted with
:class:`psycopg.sql.Identifier`; the only literals composed into statements are integers that
come from the collection's own metadata (the dimension in ``halfvec(dim)`` casts) and the index
build parameters, validated as ints here and rendered with :class:`psycopg.sql.Literal`.

Filter semantics follow :func:`stores.filters.matches` over a ``payload jsonb`` column:

* ``Eq``/``In`` use jsonb containment, ``payload @> ANY(%s::jsonb[])``, with both ``{"f": v}``
  (scalar field) and ``{"f": [v]}`` (list field holding ``v``); a GIN ``jsonb_path_ops`` index
  on ``payload`` serves them. jsonb keeps ``true`` apart from ``1``, as ``matches`` does.
* ``Range`` reads a field only when its jsonb type is ``number`` (strings, booleans and lists
  never match and never raise a cast error): ``CASE WHEN jsonb_typeof(payload -> %s) = 'number'
  THEN (payload ->> %s)::double precision > %s ... ELSE false END``.
* ``Ne``/``Nin`` (SQL semantics: the field is present): ``<present> AND NOT (payload @>
  ANY(%s::jsonb[]))``; ``Exists``: ``<present>`` or its negation, where ``<present>`` is
  ``payload ? %s AND payload -> %s NOT IN ('null', '[]')``.
* ``Prefix``: ``jsonb_path_exists(payload -> %s, '$[*] ? (@ starts with $p)', jsonb_build_object('p',
  %s::text))``; the prefix is a bound jsonpath variable, so ``%``/``_``/``\`` are plain characters
  (no ``LIKE``), and ``$[*]`` reads a scalar or every item of a list.

Every operator compiles natively here (no id-set fallback).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from quarry.errors import InvalidFilter, InvalidQuery, InvalidRequest, UnsupportedIndex
from stores.base import IndexSpec, Metric
from stores.filters import PAYLOAD_KEY, And, Eq, Exists, Filter, In, Ne, Nin, Or, Prefix, Range
from stores.routing import exact_row_limit as exact_row_limit  # shared by every backend

COLLECTION_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_-]{0,47}\Z")
"""Collection and alias names: 1-48 characters, so that derived index names fit in 63 bytes."""

METRICS: tuple[Metric, ...] = ("cosine", "ip", "l2")
MAX_DIM = 16000  # pgvector's limit for the vector type
MAX_INDEX_DIM = {"vector": 2000, "halfvec": 4000}  # HNSW/IVFFlat limits per type

_OPERATOR = {"cosine": "<=>", "ip": "<#>", "l2": "<->"}
_OPCLASS = {"cosine": "cosine_ops", "ip": "ip_ops", "l2": "l2_ops"}


def check_name(name: str, what: str = "collection") -> str:
    """Validate a collection or alias name.

    Raises:
        InvalidRequest: The name does not match :data:`COLLECTION_NAME`.
    """
    if not isinstance(name, str) or not COLLECTION_NAME.fullmatch(name):
        raise InvalidRequest(
            f"invalid {what} name {name!r}: use 1-48 letters, digits, '_' or '-', starting with a letter or '_'"
        )
    return name


def table_name(name: str) -> str:
    """Name of a collection's table: ``c_<name>``."""
    return f"c_{name}"


def table(schema: str, name: str) -> sql.Identifier:
    """Qualified identifier of a collection's table (``<schema>."c_<name>"``)."""
    return sql.Identifier(schema, table_name(name))


def index_name(name: str, suffix: str = "vec") -> str:
    """Name of a collection's vector index (``c_<name>_vec``) or of another index of it."""
    return f"c_{name}_{suffix}"


# ---------------------------------------------------------------------------- DDL


def schema_ddl(schema: str) -> list[sql.Composed]:
    """The extension, the schema and its two metadata tables; idempotent."""
    meta, aliases = (
        sql.Identifier(schema, "meta_collections"),
        sql.Identifier(schema, "meta_aliases"),
    )
    return [
        sql.SQL("CREATE EXTENSION IF NOT EXISTS {}").format(sql.Identifier("vector")),
        sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)),
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, dim integer NOT NULL, "
            "metric text NOT NULL, index_spec jsonb, "
            "created_at timestamptz NOT NULL DEFAULT now())"
        ).format(meta),
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (alias text PRIMARY KEY, "
            "collection text NOT NULL REFERENCES {} (name) ON DELETE CASCADE)"
        ).format(aliases, meta),
    ]


def collection_ddl(schema: str, name: str, dim: int) -> list[sql.Composed]:
    """A collection's table and the GIN index its filters use.

    Vectors of up to 1000 dims are stored ``PLAIN`` (inline, uncompressed: float data does not
    compress, and TOAST lookups slow scans down).
    """
    tbl = table(schema, name)
    stmts = [
        sql.SQL(
            "CREATE TABLE {} (id text PRIMARY KEY, embedding vector({}) NOT NULL, "
            "payload jsonb NOT NULL DEFAULT '{{}}'::jsonb)"
        ).format(tbl, sql.Literal(dim)),
        sql.SQL("CREATE INDEX {} ON {} USING gin (payload jsonb_path_ops)").format(
            sql.Identifier(index_name(name, "payload")), tbl
        ),
    ]
    if dim <= 1000:
        stmts.append(sql.SQL("ALTER TABLE {} ALTER COLUMN embedding SET STORAGE PLAIN").format(tbl))
    return stmts


# ---------------------------------------------------------------------------- filters


def compile_filter(flt: Filter | None) -> tuple[sql.Composable, list[Any]]:
    """Compile a typed filter into a SQL condition over ``payload`` and its parameters.

    Args:
        flt: The filter, or ``None`` for no condition.

    Returns:
        ``(condition, params)``: a composable with ``%s`` placeholders and the values to bind,
        in order.

    Raises:
        InvalidFilter: A field name is not a valid payload field name.
    """
    params: list[Any] = []
    if flt is None:
        return sql.SQL("TRUE"), params
    return _compile(flt, params), params


_PRESENT = sql.SQL("(payload ? %s AND payload -> %s NOT IN ('null'::jsonb, '[]'::jsonb))")
"""A field is present: held, not ``null``, not ``[]`` (:func:`stores.filters.present`)."""


def _compile(flt: Filter, params: list[Any]) -> sql.Composable:
    if isinstance(flt, And | Or):
        if not flt.items:
            raise InvalidFilter("$and/$or need at least one sub-filter")
        joiner = sql.SQL(" AND " if isinstance(flt, And) else " OR ")
        return sql.SQL("({})").format(joiner.join(_compile(sub, params) for sub in flt.items))
    if not PAYLOAD_KEY.fullmatch(flt.field):
        raise InvalidFilter(f"invalid field name {flt.field!r}: use letters, digits and '_'")
    if isinstance(flt, Eq | In | Ne | Nin):
        values = (flt.value,) if isinstance(flt, Eq | Ne) else flt.values
        docs = [Jsonb({flt.field: v}) for v in values] + [Jsonb({flt.field: [v]}) for v in values]
        if isinstance(flt, Eq | In):
            params.append(docs)
            return sql.SQL("payload @> ANY(%s::jsonb[])")
        params.extend([flt.field, flt.field, docs])
        return sql.SQL("({} AND NOT (payload @> ANY(%s::jsonb[])))").format(_PRESENT)
    if isinstance(flt, Exists):
        params.extend([flt.field, flt.field])
        return sql.SQL("({})" if flt.present else "(NOT {})").format(_PRESENT)
    if isinstance(flt, Prefix):
        params.extend([flt.field, flt.prefix])
        return sql.SQL(
            "COALESCE(jsonb_path_exists(payload -> %s, '$[*] ? (@ starts with $p)', "
            "jsonb_build_object('p', %s::text)), false)"
        )
    return _compile_range(flt, params)


def _compile_range(flt: Range, params: list[Any]) -> sql.Composable:
    bounds = [(">", flt.gt), (">=", flt.gte), ("<", flt.lt), ("<=", flt.lte)]
    tests = [(op, float(v)) for op, v in bounds if v is not None]
    if not tests:
        raise InvalidFilter(f"the range on {flt.field!r} has no bound")
    params.append(flt.field)
    conds = []
    for op, value in tests:
        conds.append(sql.SQL("(payload ->> %s)::double precision {} %s").format(sql.SQL(op)))
        params.extend([flt.field, value])
    return sql.SQL("(CASE WHEN jsonb_typeof(payload -> %s) = 'number' THEN {} ELSE false END)").format(
        sql.SQL(" AND ").join(conds)
    )


def index_served(flt: Filter) -> bool:
    """Whether the payload GIN index can find the rows of ``flt`` without reading the table.

    ``Eq``/``In`` are (jsonb containment); an ``And`` is when any part is (the rest is
    rechecked); an ``Or`` only when every part is. ``Range`` is not.
    """
    if isinstance(flt, Eq | In):
        return True
    if isinstance(flt, And):
        return any(index_served(sub) for sub in flt.items)
    if isinstance(flt, Or):
        return all(index_served(sub) for sub in flt.items)
    return False


# ---------------------------------------------------------------------------- indexes

_HNSW_KEYS = {
    "M": "m",
    "m": "m",
    "efConstruction": "ef_construction",
    "ef_construction": "ef_construction",
}
_IVF_KEYS = {"nlist": "lists", "lists": "lists"}
_LIMITS = {"m": (2, 100), "ef_construction": (4, 1000), "lists": (1, 32768)}
_DEFAULTS = {"HNSW": {"m": 16, "ef_construction": 64}, "IVF_FLAT": {"lists": 100}}
_STANDARD = {"m": "M", "ef_construction": "efConstruction", "lists": "nlist"}
SEARCH_KEYS = frozenset({"ef", "nprobe", "iterative_scan", "max_scan_tuples", "scan_mem_multiplier", "max_probes"})


@dataclass(frozen=True)
class IndexPlan:
    """A validated pgvector index build.

    Attributes:
        method: ``"hnsw"``, ``"ivfflat"`` or ``None`` for FLAT (no index: exact scans).
        halfvec: Index ``embedding::halfvec(dim)`` (half the memory, dims up to 4000).
        with_params: Storage parameters in pgvector's names (``m``, ``ef_construction``,
            ``lists``).
        spec: The spec recorded for ``describe_index``: the collection's metric, the effective
            build parameters in standard names (``M``, ``efConstruction``, ``nlist``).
    """

    method: str | None
    halfvec: bool
    with_params: dict[str, int]
    spec: IndexSpec


def plan_index(spec: IndexSpec, dim: int, metric: Metric) -> IndexPlan:
    """Validate an index spec for pgvector and fill in its defaults.

    The index is always built for the collection's ``metric`` (pgvector's operator class must
    match the distance operator the collection's searches use).

    Args:
        spec: Requested index. ``params``: HNSW ``M`` (2-100, default 16), ``efConstruction``
            (4-1000, >= 2*M, default 64); IVF_FLAT ``nlist`` (1-32768, default 100); both
            ``halfvec`` (bool). ``search_params``: ``ef`` (HNSW), ``nprobe`` (IVF) and the
            iterative-scan settings of :data:`SEARCH_KEYS`.
        dim: Collection dimension.
        metric: Collection metric.

    Returns:
        The validated plan.

    Raises:
        UnsupportedIndex: ``IVF_PQ``/``DISKANN``, unknown or out-of-range parameters, or a
            dimension above pgvector's index limit (2000 for vector, 4000 for halfvec).
    """
    if spec.kind not in ("FLAT", "HNSW", "IVF_FLAT"):
        raise UnsupportedIndex(f"pgvector cannot build {spec.kind}; it builds FLAT (exact), HNSW and IVF_FLAT")
    bad_search = set(spec.search_params) - SEARCH_KEYS
    if bad_search:
        raise UnsupportedIndex(f"unknown pgvector search parameters {sorted(bad_search)}")
    params = dict(spec.params)
    halfvec = params.pop("halfvec", False)
    if not isinstance(halfvec, bool):
        raise UnsupportedIndex(f"index parameter halfvec must be true or false, got {halfvec!r}")
    if spec.kind == "FLAT":
        if params:
            raise UnsupportedIndex(f"a FLAT index takes no parameters, got {sorted(params)}")
        return IndexPlan(None, False, {}, IndexSpec("FLAT", metric, {}, dict(spec.search_params)))
    with_params = _with_params(spec.kind, params)
    kind_type = "halfvec" if halfvec else "vector"
    if dim > MAX_INDEX_DIM[kind_type]:
        raise UnsupportedIndex(
            f"pgvector indexes {kind_type} up to {MAX_INDEX_DIM[kind_type]} dimensions, "
            f"the collection has {dim}" + ("" if halfvec else "; use params={'halfvec': True}")
        )
    standard: dict[str, Any] = {_STANDARD[k]: v for k, v in with_params.items()}
    if halfvec:
        standard["halfvec"] = True
    method = "hnsw" if spec.kind == "HNSW" else "ivfflat"
    recorded = IndexSpec(spec.kind, metric, standard, dict(spec.search_params))
    return IndexPlan(method, halfvec, with_params, recorded)


def _with_params(kind: str, params: dict[str, Any]) -> dict[str, int]:
    names = _HNSW_KEYS if kind == "HNSW" else _IVF_KEYS
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise UnsupportedIndex(
            f"unknown {kind} parameters {unknown} for pgvector; supported: {sorted({*names, 'halfvec'})}"
        )
    out = dict(_DEFAULTS[kind])
    for key, value in params.items():
        name = names[key]
        low, high = _LIMITS[name]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise UnsupportedIndex(f"{kind} parameter {key} must be an int in [{low}, {high}]")
        out[name] = value
    if kind == "HNSW" and out["ef_construction"] < 2 * out["m"]:
        raise UnsupportedIndex("HNSW efConstruction must be at least 2 * M")
    return out


def _indexed_expr(dim: int, halfvec: bool, column: str) -> sql.Composable:
    if not halfvec:
        return sql.Identifier(*column.split("."))
    return sql.SQL("({}::halfvec({}))").format(sql.Identifier(*column.split(".")), sql.Literal(dim))


def create_index_sql(schema: str, name: str, plan: IndexPlan, dim: int, metric: Metric, idx: str) -> sql.Composed:
    """``CREATE INDEX <idx> ON <table> USING hnsw|ivfflat (<expr> <opclass>) WITH (...)``."""
    if plan.method is None:
        raise UnsupportedIndex("a FLAT index has no CREATE INDEX statement")
    opclass = ("halfvec_" if plan.halfvec else "vector_") + _OPCLASS[metric]
    options = sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.SQL(key), sql.Literal(value)) for key, value in plan.with_params.items()
    )
    return sql.SQL("CREATE INDEX {} ON {} USING {} ({} {}) WITH ({})").format(
        sql.Identifier(idx),
        table(schema, name),
        sql.SQL(plan.method),
        _indexed_expr(dim, plan.halfvec, "embedding"),
        sql.SQL(opclass),
        options,
    )


# ---------------------------------------------------------------------------- search


def search_sql(  # noqa: PLR0913 - the statement's parts
    schema: str, name: str, dim: int, metric: Metric, halfvec: bool, cond: sql.Composable, with_payload: bool = True
) -> sql.Composed:
    """Batched k-NN: one LATERAL index scan per row of ``unnest(%b::vector[])`` (binary).

    Placeholders, in order: the query vectors (``list`` of ``(dim,) float32``), the filter's
    parameters, ``top_k``. Rows: ``(query ordinal from 1, id, exact distance, payload)`` sorted
    by query then distance. The inner ``ORDER BY`` is the indexed expression (``halfvec`` casts
    when the index is on halfvec) so that the planner uses the index; the returned distance is
    recomputed in full precision and the outer sort restores strict order after a
    ``relaxed_order`` iterative scan. With ``with_payload=False`` the payload column is ``'{}'``.
    """
    op = sql.SQL(_OPERATOR[metric])
    exact = sql.SQL("{} {} {}").format(sql.Identifier("embedding"), op, sql.SQL("q.v"))
    order = sql.SQL("{} {} {}").format(_indexed_expr(dim, halfvec, "embedding"), op, _indexed_expr(dim, halfvec, "q.v"))
    return sql.SQL(
        "SELECT q.ord, h.id, h.dist, {} "
        "FROM unnest(%b::vector[]) WITH ORDINALITY AS q(v, ord) "
        "CROSS JOIN LATERAL ("
        "SELECT id, payload, {} AS dist FROM {} WHERE {} ORDER BY {} LIMIT %s"
        ") AS h ORDER BY q.ord, h.dist"
    ).format(_payload_column(with_payload), exact, table(schema, name), cond, order)


def candidates_search_sql(
    schema: str, name: str, metric: Metric, cond: sql.Composable, with_payload: bool = True
) -> sql.Composed:
    """Batched exact k-NN over the rows a selective filter matches, read once per batch.

    Placeholders, in order: the filter's parameters, the query vectors, ``top_k``. The
    ``MATERIALIZED`` CTE holds the matching rows; every query ranks them by exact distance (no
    vector index can serve a CTE scan). Rows as in :func:`search_sql`.
    """
    op = sql.SQL(_OPERATOR[metric])
    return sql.SQL(
        "WITH cand AS MATERIALIZED (SELECT id, payload, embedding FROM {} WHERE {}) "
        "SELECT q.ord, h.id, h.dist, {} "
        "FROM unnest(%b::vector[]) WITH ORDINALITY AS q(v, ord) "
        "CROSS JOIN LATERAL ("
        "SELECT id, payload, embedding {} q.v AS dist FROM cand ORDER BY dist LIMIT %s"
        ") AS h ORDER BY q.ord, h.dist"
    ).format(table(schema, name), cond, _payload_column(with_payload), op)


def _payload_column(with_payload: bool) -> sql.Composable:
    return sql.SQL("h.payload") if with_payload else sql.SQL("'{}'::jsonb")


def score(metric: Metric, distance: float) -> float:
    """Turn a pgvector distance into a higher-is-better score.

    ``<=>`` is cosine distance (score ``1 - d``), ``<#>`` the negative inner product
    (score ``-d`` = the inner product), ``<->`` the Euclidean distance (score ``-d``).
    """
    return 1.0 - distance if metric == "cosine" else -distance


def search_settings(kind: str | None, params: dict[str, Any], top_k: int) -> list[tuple[str, str]]:
    """The ``set_config(name, value, is_local => true)`` pairs for one search transaction.

    Args:
        kind: The collection's index kind (``None``/``"FLAT"`` for none).
        params: Effective search parameters (the index's, overridden by the call's).
        top_k: Hits per query; HNSW ``ef_search`` is raised to at least this (max 1000).

    Returns:
        ``(guc, value)`` pairs.

    Raises:
        InvalidQuery: A parameter is out of pgvector's range.
    """
    if kind == "HNSW":
        ef = max(_int_param(params, "ef", 40, 1, 1000), min(top_k, 1000))
        mode = str(params.get("iterative_scan", "relaxed_order"))
        if mode not in ("off", "relaxed_order", "strict_order"):
            raise InvalidQuery(f"hnsw iterative_scan must be off, relaxed_order or strict_order, got {mode!r}")
        tuples = _int_param(params, "max_scan_tuples", 20000, 1, 2**31 - 1)
        mult = _int_param(params, "scan_mem_multiplier", 2, 1, 1000)
        return [
            ("hnsw.ef_search", str(ef)),
            ("hnsw.iterative_scan", mode),
            ("hnsw.max_scan_tuples", str(tuples)),
            ("hnsw.scan_mem_multiplier", str(mult)),
        ]
    if kind == "IVF_FLAT":
        probes = _int_param(params, "nprobe", 1, 1, 32768)
        mode = str(params.get("iterative_scan", "relaxed_order"))
        if mode not in ("off", "relaxed_order"):
            raise InvalidQuery(f"ivfflat iterative_scan must be off or relaxed_order, got {mode!r}")
        max_probes = _int_param(params, "max_probes", 32768, 1, 32768)
        return [
            ("ivfflat.probes", str(probes)),
            ("ivfflat.iterative_scan", mode),
            ("ivfflat.max_probes", str(max(max_probes, probes))),
        ]
    return []


def _int_param(params: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidQuery(f"search parameter {key} must be an int in [{low}, {high}], got {value!r}")
    return value
