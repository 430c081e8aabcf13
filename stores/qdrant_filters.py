"""Pieces shared by the two Qdrant backends: filter compiler, id mapping, payload codec, specs.

Both ``qdrant-client`` (server and local mode) and ``qdrant-edge`` take the same structured
filter models (``Filter(must/should)``, ``FieldCondition(match=MatchValue/MatchAny,
range=Range)``) from different Python packages; :class:`Dialect` names the constructors so
:func:`compile_filter` serves both. Values are passed as typed model fields, never as text.

Semantics follow :func:`stores.filters.matches`:

* strings match with ``MatchValue``/``MatchAny`` (a list payload matches when any item does);
* numbers compile to a closed ``Range`` (``gte == lte == v``), so ``Eq("n", 3)`` also matches a
  stored ``3.0`` as it does in Python (integers beyond 2**53 lose precision there);
* booleans use ``MatchValue(bool)``, except on qdrant-edge-py 0.9.0, whose binding turns a
  Python ``bool`` into the integer 0/1 (``ValueVariants`` tries ``Integer`` before ``Bool``):
  there every boolean field ``f`` is mirrored as the keyword ``"true"``/``"false"`` under
  ``_bools.f`` and matched on that mirror.

The other operators, per path (``stores.filters`` defines their semantics):

=============  ==========================================================================
``$exists``    native: ``is_empty(f)`` (absent, ``null`` or ``[]``) or ``must_not`` of it
``$ne``        native: ``must_not: [is_empty(f), <the $eq condition>]``
``$nin``       native: ``must_not: [is_empty(f), <the $in conditions>]``
``$prefix``    id set: Qdrant has no string-prefix condition on keyword fields, so the store
               scrolls the points holding ``f`` (``must_not is_empty``), tests the prefix in
               Python and compiles ``has_id`` of those that match
               (:func:`stores.routing.scanned_ids`, at most ``QUARRY_STORE__MAX_SCAN_IDS``)
=============  ==========================================================================

Qdrant point ids must be unsigned integers or UUIDs: a record id maps to ``uuid5`` in a fixed
namespace, and the caller's id is kept in the payload under ``_id``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from quarry.errors import InvalidFilter, InvalidRequest, UnsupportedIndex
from stores.base import IndexSpec, Metric, Payload, ScoredId, VectorRecord
from stores.filters import PAYLOAD_KEY, And, Eq, Exists, Filter, Ne, Nin, Or, Prefix, Range, Scalar
from stores.milvus_expr import unsupported
from stores.routing import FilterRouter, scanned_ids

ID_NAMESPACE = uuid.UUID("6f1c3a52-9d0e-4b8e-a1c4-51a7e0b2d9f3")
ID_KEY = "_id"
BOOL_KEY = "_bools"
RESERVED_KEYS = frozenset({ID_KEY, BOOL_KEY})
FieldIndex = Literal["keyword", "float", "bool"]
Quantization = Literal["scalar", "product"]
PQ_RATIOS = (4, 8, 16, 32, 64)
SCROLL_PAGE = 1024
"""Points per scroll page when a ``$prefix`` is evaluated on the payloads."""
DEFAULT_M = 16
DEFAULT_EF_CONSTRUCT = 100
DEFAULT_FULL_SCAN_KB = 10_000
MIN_FULL_SCAN_KB = 10
_QUANTIZATION: dict[str, Quantization] = {
    "int8": "scalar",
    "scalar": "scalar",
    "sq": "scalar",
    "pq": "product",
    "product": "product",
}


@dataclass(frozen=True)
class Dialect:
    """Model constructors of one Qdrant Python package.

    Attributes:
        filter: ``Filter(must=..., should=..., must_not=...)``.
        field: ``FieldCondition(key=..., match=..., range=...)``.
        match_value: ``MatchValue`` of one ``str``/``bool`` value.
        match_any: ``MatchAny`` of a list of strings.
        range: ``Range(gt=, gte=, lt=, lte=)`` on numbers.
        is_empty: ``is_empty`` condition of a field key.
        has_id: ``has_id`` condition of a list of point ids.
        bool_mirror: Booleans are matched on the ``_bools.<field>`` keyword mirror.
    """

    filter: Callable[..., Any]
    field: Callable[..., Any]
    match_value: Callable[[Any], Any]
    match_any: Callable[[list[str]], Any]
    range: Callable[..., Any]
    is_empty: Callable[[str], Any]
    has_id: Callable[[list[str]], Any]
    bool_mirror: bool = False


def point_id(record_id: str) -> str:
    """The Qdrant point id (a UUID string) of a caller's record id."""
    return str(uuid.uuid5(ID_NAMESPACE, record_id))


PrefixIds = Callable[[Prefix], list[str]]
"""The record ids whose payload matches a ``Prefix`` (the store's scan; see the module docstring)."""


def compile_filter(flt: Filter, dialect: Dialect, prefix_ids: PrefixIds | None = None) -> Any:
    """Compile a typed filter into the dialect's ``Filter`` model.

    Args:
        flt: The typed filter tree.
        dialect: Constructors of the target package.
        prefix_ids: Resolves a ``$prefix`` into matching record ids (``None``: ``$prefix`` is
            refused).

    Returns:
        A ``Filter`` model of the dialect's package.

    Raises:
        InvalidFilter: A ``$prefix`` without ``prefix_ids``, or what ``prefix_ids`` raises.
    """
    if isinstance(flt, And):
        return dialect.filter(must=[_condition(sub, dialect, prefix_ids) for sub in flt.items])
    if isinstance(flt, Or):
        if not flt.items:  # matches nothing, as ``any([])``
            return dialect.filter(must_not=[dialect.filter()])
        return dialect.filter(should=[_condition(sub, dialect, prefix_ids) for sub in flt.items])
    return dialect.filter(must=[_condition(flt, dialect, prefix_ids)])


def _condition(flt: Filter, dialect: Dialect, prefix_ids: PrefixIds | None) -> Any:
    if isinstance(flt, And | Or):
        return compile_filter(flt, dialect, prefix_ids)
    if isinstance(flt, Exists):
        empty = dialect.is_empty(flt.field)
        return dialect.filter(must_not=[empty]) if flt.present else empty
    if isinstance(flt, Ne | Nin):
        values = (flt.value,) if isinstance(flt, Ne) else flt.values
        parts = _value_conditions(flt.field, values, dialect)
        return dialect.filter(must_not=[dialect.is_empty(flt.field), *parts])
    if isinstance(flt, Prefix):
        if prefix_ids is None:
            raise InvalidFilter(unsupported(flt, "Qdrant"))
        return dialect.has_id([point_id(i) for i in prefix_ids(flt)])
    if isinstance(flt, Range):
        bounds = {"gt": flt.gt, "gte": flt.gte, "lt": flt.lt, "lte": flt.lte}
        return dialect.field(key=flt.field, range=dialect.range(**bounds))
    values = (flt.value,) if isinstance(flt, Eq) else flt.values
    parts = _value_conditions(flt.field, values, dialect)
    return parts[0] if len(parts) == 1 else dialect.filter(should=parts)


def _value_conditions(field: str, values: tuple[Scalar, ...], dialect: Dialect) -> list[Any]:
    strings = [v for v in values if isinstance(v, str)]
    bools = [v for v in values if isinstance(v, bool)]
    numbers = [v for v in values if not isinstance(v, str | bool)]
    parts: list[Any] = []
    if strings:
        match = dialect.match_value(strings[0]) if len(strings) == 1 else dialect.match_any(strings)
        parts.append(dialect.field(key=field, match=match))
    for flag in dict.fromkeys(bools):
        if dialect.bool_mirror:
            key, value = f"{BOOL_KEY}.{field}", _mirror(flag)
            parts.append(dialect.field(key=key, match=dialect.match_value(value)))
        else:
            parts.append(dialect.field(key=field, match=dialect.match_value(flag)))
    for number in dict.fromkeys(numbers):
        parts.append(dialect.field(key=field, range=dialect.range(gte=number, lte=number)))
    return parts


def _mirror(flag: bool) -> str:
    return "true" if flag else "false"


def prefix_scan(
    flt: Prefix, dialect: Dialect, scroll: Callable[[Any], Iterable[Mapping[str, Any] | None]], limit: int
) -> list[str]:
    """The record ids of the points whose payload matches ``flt``, by scrolling the points holding its field.

    Args:
        flt: The prefix condition.
        dialect: Constructors of the store's package.
        scroll: ``scroll(filter)`` iterating the stored payloads of the points that match ``filter``.
        limit: Most matching ids (``StoreSettings.max_scan_ids``).

    Raises:
        InvalidFilter: More than ``limit`` points match (the message says what to do).
    """
    holding = dialect.filter(must_not=[dialect.is_empty(flt.field)])
    return scanned_ids(flt, (decode_payload(p) for p in scroll(holding)), limit, "Qdrant")


def encode_payload(record_id: str, payload: Mapping[str, Any], bool_mirror: bool) -> dict[str, Any]:
    """The stored payload: the caller's fields, ``_id`` and (edge) the boolean mirror.

    Raises:
        InvalidRequest: The payload uses a reserved key (``_id``, ``_bools``).
    """
    clash = RESERVED_KEYS.intersection(payload)
    if clash:
        raise InvalidRequest(
            f"payload key {sorted(clash)[0]!r} of record {record_id!r} is reserved by the Qdrant store"
        )
    stored: dict[str, Any] = {**payload, ID_KEY: record_id}
    if bool_mirror:
        flags = {k: _mirror(v) for k, v in payload.items() if isinstance(v, bool)}
        if flags:
            stored[BOOL_KEY] = flags
    return stored


def decode_payload(stored: Mapping[str, Any] | None) -> tuple[str, Payload]:
    """Split a stored payload into the caller's id and payload."""
    payload = dict(stored or {})
    payload.pop(BOOL_KEY, None)
    return str(payload.pop(ID_KEY)), payload


def index_fields(payload: Mapping[str, Any], bool_mirror: bool) -> dict[str, FieldIndex]:
    """Payload indexes the fields of one payload want (filterable names only).

    Strings and string lists get a keyword index, numbers a float index (it serves ranges on
    int and float values), booleans a bool index, or a keyword index on their edge mirror.
    """
    wanted: dict[str, FieldIndex] = {}
    for key, value in payload.items():
        if not PAYLOAD_KEY.fullmatch(key) or key in RESERVED_KEYS:
            continue
        if isinstance(value, bool):
            if bool_mirror:
                wanted[f"{BOOL_KEY}.{key}"] = "keyword"
            else:
                wanted[key] = "bool"
        elif isinstance(value, int | float):
            wanted[key] = "float"
        elif isinstance(value, str) or (isinstance(value, list) and value):
            wanted[key] = "keyword"
    return wanted


@dataclass(frozen=True)
class HnswSettings:
    """Engine settings of an HNSW build (Qdrant terms).

    Attributes:
        m: Edges per node (``M``).
        ef_construct: Build-time beam (``efConstruction``).
        full_scan_kb: Below this many KiB of (candidate) vectors Qdrant scans exactly instead of
            walking the graph; segments smaller than it are not indexed either.
        quantization: ``None``, ``"scalar"`` (int8) or ``"product"``.
        pq_ratio: Product quantization compression (4, 8, 16, 32 or 64).
        on_disk: Keep the HNSW graph on disk.
    """

    m: int
    ef_construct: int
    full_scan_kb: int
    quantization: Quantization | None
    pq_ratio: int
    on_disk: bool


def hnsw_settings(spec: IndexSpec, dim: int) -> HnswSettings:
    """Map an ``HNSW`` spec's parameters to Qdrant settings.

    Args:
        spec: ``params``: ``M``, ``efConstruction``, ``full_scan_threshold_kb``,
            ``quantization`` (``int8``/``scalar`` or ``pq``/``product``), ``compression``
            (``x4``..``x64``) or PQ ``m`` (sub-vectors), ``on_disk``.
        dim: The collection's dimension (turns PQ ``m`` into a compression ratio).

    Returns:
        The settings, defaults filled in.

    Raises:
        UnsupportedIndex: Not ``HNSW``/``FLAT``, or a parameter Qdrant cannot honour.
    """
    if spec.kind not in ("HNSW", "FLAT"):
        raise UnsupportedIndex(
            f"Qdrant cannot build {spec.kind}: it builds HNSW (optionally with int8 scalar or "
            "product quantization) and searches exactly (FLAT)"
        )
    p = spec.params
    try:
        m, ef = int(p.get("M", DEFAULT_M)), int(p.get("efConstruction", DEFAULT_EF_CONSTRUCT))
        full_scan = int(p.get("full_scan_threshold_kb", DEFAULT_FULL_SCAN_KB))
    except (TypeError, ValueError) as exc:
        raise UnsupportedIndex(f"HNSW parameters must be integers: {p}") from exc
    if m < 2 or ef < 4 or full_scan < MIN_FULL_SCAN_KB:
        raise UnsupportedIndex(
            f"Qdrant needs M >= 2, efConstruction >= 4 and full_scan_threshold_kb >= "
            f"{MIN_FULL_SCAN_KB}; got {m}, {ef}, {full_scan}"
        )
    quant = p.get("quantization")
    if quant is not None and str(quant).lower() not in _QUANTIZATION:
        raise UnsupportedIndex(f"unknown Qdrant quantization {quant!r}; use 'int8' or 'pq'")
    kind = _QUANTIZATION[str(quant).lower()] if quant is not None else None
    ratio = _pq_ratio(p, dim) if kind == "product" else 0
    return HnswSettings(m, ef, full_scan, kind, ratio, bool(p.get("on_disk", False)))


def _pq_ratio(params: Mapping[str, Any], dim: int) -> int:
    if "compression" in params:
        raw = str(params["compression"]).lower().lstrip("x")
        if not raw.isdigit() or int(raw) not in PQ_RATIOS:
            raise UnsupportedIndex(
                f"Qdrant PQ compression must be one of {[f'x{r}' for r in PQ_RATIOS]}"
            )
        return int(raw)
    if "m" in params:  # PQ sub-vectors of 1 byte each: raw 4*dim bytes -> m bytes
        wanted = 4 * dim / max(int(params["m"]), 1)
        return min(PQ_RATIOS, key=lambda r: abs(r - wanted))
    return 16


def spec_to_json(spec: IndexSpec) -> dict[str, Any]:
    """A JSON-able form of a spec (kept in collection metadata)."""
    return {
        "kind": spec.kind,
        "metric": spec.metric,
        "params": dict(spec.params),
        "search_params": dict(spec.search_params),
    }


def spec_from_json(raw: Mapping[str, Any] | None) -> IndexSpec | None:
    """Inverse of :func:`spec_to_json` (``None`` stays ``None``)."""
    if not raw:
        return None
    return IndexSpec(
        raw["kind"], raw["metric"], dict(raw.get("params", {})), dict(raw.get("search_params", {}))
    )


def search_knobs(
    spec: IndexSpec | None, overrides: Mapping[str, Any] | None
) -> tuple[int | None, bool, dict[str, Any] | None]:
    """Query-time settings: ``(hnsw_ef, exact, quantization search params or None)``.

    No index (or ``FLAT``) searches exactly; ``ef``, ``exact``, ``rescore`` and ``oversampling``
    come from the spec's ``search_params``, overridden per call. ``ignore_quantization`` with
    ``exact`` scores the full vectors only (Qdrant's ``quantization.ignore``).
    """
    merged = {**(spec.search_params if spec else {}), **(overrides or {})}
    exact = bool(merged.get("exact", spec is None or spec.kind == "FLAT"))
    ef = merged.get("ef")
    quantized = spec is not None and spec.params.get("quantization") is not None
    quant: dict[str, Any] | None = None
    if quantized and exact and merged.get("ignore_quantization"):
        quant = {"ignore": True}  # the stored full vectors only, not their codes (search_exact)
    elif quantized and not exact:
        quant = {"rescore": bool(merged.get("rescore", True))}
        if merged.get("oversampling") is not None:
            quant["oversampling"] = float(merged["oversampling"])
    return (int(ef) if ef is not None else None), exact, quant


@dataclass(frozen=True)
class Knobs:
    """Query-time settings of one search.

    Attributes:
        ef: HNSW ``ef`` (``None``: the engine's).
        exact: Exact search (of the points the filter matches).
        quantization: Quantization search params, or ``None``.
        acorn: Ask for ACORN (filtered graph walks).
    """

    ef: int | None
    exact: bool
    quantization: dict[str, Any] | None
    acorn: bool


def routed_knobs(  # noqa: PLR0913 - the search's parts
    spec: IndexSpec | None,
    overrides: Mapping[str, Any] | None,
    flt: Filter | None,
    top_k: int,
    router: FilterRouter,
    collection: str,
    count: Callable[[Filter | None], int],
) -> Knobs:
    """:func:`search_knobs`, with a filtered search routed by the points the filter matches.

    Qdrant plans a filtered search from its own cardinality estimate, which depends on how the
    filter is written (a ``$in`` on numbers is a ``should`` of ranges, a range is estimated
    from its histogram): the router counts the matching points instead (an exact count through
    the payload indexes, cached per filter), whatever the form. At most the router's limit:
    ``exact=True``, which scores only the matching points (found through the payload index).
    Above: the graph with the filter and ACORN. An explicit ``exact`` search parameter wins.

    Args:
        spec: The collection's index (``None``: exact search).
        overrides: The call's ``search_params``.
        flt: The filter, if any.
        top_k: Hits per query.
        router: The store's router.
        collection: The physical collection.
        count: ``count(filter or None)``: exact number of matching points (all with ``None``).
    """
    ef, exact, quant = search_knobs(spec, overrides)
    forced = "exact" in {**(spec.search_params if spec else {}), **(overrides or {})}
    if flt is None or exact or forced:
        return Knobs(ef, exact, quant, flt is not None and not exact)
    decision = router.decide(collection, flt, top_k, lambda: count(None), lambda _cap: count(flt))
    if decision.route == "exact":
        return Knobs(ef, True, None, False)
    return Knobs(ef, False, quant, True)


def new_index_fields(
    payloads: Sequence[Mapping[str, Any]], known: set[str], bool_mirror: bool
) -> dict[str, FieldIndex]:
    """Payload indexes a batch wants that the collection does not have yet (first type wins)."""
    wanted: dict[str, FieldIndex] = {}
    for payload in payloads:
        for key, kind in index_fields(payload, bool_mirror).items():
            if key not in known:
                wanted.setdefault(key, kind)
    return wanted


def records_in_order(found: Sequence[Any], ids: Sequence[str]) -> list[VectorRecord]:
    """Engine records (``.payload``, ``.vector``) as ours, in the order of ``ids``."""
    by_id = {}
    for rec in found:
        rid, payload = decode_payload(rec.payload)
        by_id[rid] = VectorRecord(rid, np.asarray(rec.vector, np.float32), payload)
    return [by_id[i] for i in ids if i in by_id]


def hit(metric: Metric, point: Any) -> ScoredId:
    """An engine hit as a :class:`~stores.base.ScoredId` (``l2``: ``-distance``)."""
    rid, payload = decode_payload(point.payload)
    raw = float(point.score)
    return ScoredId(rid, -raw if metric == "l2" else raw, payload)
