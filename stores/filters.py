r"""Typed metadata filters: parsed once from JSON, compiled by each backend.

The JSON form follows the operator style of MongoDB/Chroma/Pinecone filters::

    {"year": 2020}                                   # eq (shorthand)
    {"year": {"$gte": 2000, "$lt": 2010}}            # range
    {"tag": {"$in": ["a", "b"]}}                     # in
    {"$or": [{"tag": "a"}, {"year": {"$gt": 2015}}]}  # or / and over sub-filters
    {"lang": {"$ne": "en"}}                          # present and different
    {"tag": {"$nin": ["a", "b"]}}                    # present and none of
    {"path": {"$exists": true}}                      # present (false: absent)
    {"path": {"$prefix": "docs/api/"}}               # string starting with

``$ne``/``$nin`` follow SQL, not MongoDB: they match documents that HAVE the field with a value
other than the given one(s); a document without the field matches neither. A field is present
when the payload holds it with a value that is not ``null`` and not an empty list (Qdrant's
``is_empty`` reading, which every backend follows) (combine with
``{"f": {"$exists": false}}`` in an ``$or`` for MongoDB's reading). For a list-valued field,
``$ne``/``$nin`` hold when no item equals a given value (the negation of ``$eq``/``$in`` on a
present field). ``$prefix`` is an exact character prefix of a string value (or of any string
item of a list): ``%``, ``_``, ``*`` and ``\`` are plain characters, never wildcards; numbers
and booleans never match it.

Several keys in one object are ANDed. Backends never paste user text into SQL or a Milvus
expression: they compile the typed tree with bound parameters (``compile_*`` in each backend).

:func:`parse_filter` is the one check every mode (BM25, dense, hybrid) and every backend relies
on: what it returns is something every engine takes. Strings hold valid Unicode without NUL
(PostgreSQL's jsonb and the UTF-8 of every driver refuse the rest), numbers are finite (a NaN
bound crashed the Qdrant edge engine), and a filter stays within :class:`FilterLimits` (a
250,000-value ``$in`` held a Milvus search past the REST deadline).
:func:`matches` evaluates a filter in Python (used by the BM25 channel and by tests as the
reference semantics).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from quarry.errors import InvalidFilter, clip

Scalar = str | int | float | bool
FieldType = Literal["str", "int", "float", "bool"]
FIELD_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
"""A metadata field name as clients write it (documents and filters)."""
PAYLOAD_KEY = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
"""A payload key the stores take: a field name, or a shared collection's per-tenant key
(``<tenant>__m_<field>``, :func:`quarry.services.namespace.stored_field`), up to 32 + 4 + 64 characters."""


@dataclass(frozen=True)
class Eq:
    """``field == value`` (for a list-valued field: the list contains ``value``)."""

    field: str
    value: Scalar


@dataclass(frozen=True)
class In:
    """``field`` equals one of ``values``."""

    field: str
    values: tuple[Scalar, ...]


@dataclass(frozen=True)
class Range:
    """``gt < field``, ``gte <= field``, ``field < lt``, ``field <= lte`` (bounds optional)."""

    field: str
    gt: float | None = None
    gte: float | None = None
    lt: float | None = None
    lte: float | None = None


@dataclass(frozen=True)
class And:
    """All sub-filters hold."""

    items: tuple[Filter, ...]


@dataclass(frozen=True)
class Or:
    """At least one sub-filter holds."""

    items: tuple[Filter, ...]


@dataclass(frozen=True)
class Ne:
    """``field`` is present and (no item of) it equals ``value`` (SQL ``<>``: absent never matches)."""

    field: str
    value: Scalar


@dataclass(frozen=True)
class Nin:
    """``field`` is present and (no item of) it equals any of ``values`` (absent never matches)."""

    field: str
    values: tuple[Scalar, ...]


@dataclass(frozen=True)
class Exists:
    """``field`` is present in the payload (``present=True``) or absent (``present=False``)."""

    field: str
    present: bool


@dataclass(frozen=True)
class Prefix:
    """``field`` is a string (or a list with a string item) starting with ``prefix``, literally."""

    field: str
    prefix: str


Filter = Eq | In | Range | Ne | Nin | Exists | Prefix | And | Or

_RANGE_OPS = {"$gt": "gt", "$gte": "gte", "$lt": "lt", "$lte": "lte"}


@dataclass(frozen=True)
class FilterLimits:
    """How large one filter may be (``QUARRY_SEARCH__MAX_FILTER_*``; see ``SearchSettings``).

    Attributes:
        in_values: Most values in one ``$in`` list.
        values: Most values in the whole filter (every ``$eq``/``$ne``/shorthand value,
            ``$in``/``$nin`` item, range bound, ``$exists`` and ``$prefix`` counts one).
        depth: Most levels of ``$and``/``$or`` nesting (a flat filter has depth 0).
    """

    in_values: int = 1024
    values: int = 4096
    depth: int = 8


class _Parse:
    """One parse: the schema, the limits and the values counted so far."""

    def __init__(self, schema: Mapping[str, FieldType] | None, limits: FilterLimits, names: re.Pattern[str]) -> None:
        self.schema = schema
        self.limits = limits
        self.names = names
        self.values = 0

    def count(self, n: int) -> None:
        self.values += n
        if self.values > self.limits.values:
            raise InvalidFilter(
                f"the filter holds more than {self.limits.values:,} values; the limit is "
                f"{self.limits.values:,} (QUARRY_SEARCH__MAX_FILTER_VALUES)"
            )


def parse_filter(
    raw: Mapping[str, Any] | None,
    schema: Mapping[str, FieldType] | None = None,
    limits: FilterLimits | None = None,
    *,
    stored: bool = False,
) -> Filter | None:
    """Parse the JSON filter form into a typed tree, checking fields, types, values and size.

    Args:
        raw: The JSON object (``None`` or ``{}`` means no filter).
        schema: Known payload fields and their types. When given, an unknown field or a value
            of the wrong type is rejected.
        limits: Size limits (default :class:`FilterLimits`'s).
        stored: The filter names stored payload keys (:data:`PAYLOAD_KEY`: the recall monitor's
            recorded filters, whose shared-collection keys are ``<tenant>__m_<field>``), not
            field names as clients write them (:data:`FIELD_NAME`).

    Returns:
        The typed filter, or ``None`` for an empty filter.

    Raises:
        InvalidFilter: Unknown operator or field, wrong value type, empty ``$in``/``$nin``/``$or``,
            a non-boolean ``$exists``, a ``$prefix`` that is not a string or on a non-string field; a
            string with a lone UTF-16 surrogate or a NUL; a number that is not finite; a filter
            past one of ``limits`` (the message names the setting).
    """
    return _parse(raw, _Parse(schema, limits or FilterLimits(), PAYLOAD_KEY if stored else FIELD_NAME), 0)


def _parse(raw: Mapping[str, Any] | None, state: _Parse, depth: int) -> Filter | None:
    if not raw:
        return None
    if not isinstance(raw, Mapping):
        raise InvalidFilter(f"a filter must be a JSON object, got {type(raw).__name__}")
    items = [_parse_key(key, value, state, depth) for key, value in raw.items()]
    return items[0] if len(items) == 1 else And(tuple(items))


def _parse_key(key: str, value: Any, state: _Parse, depth: int) -> Filter:
    if key in ("$and", "$or"):
        if depth >= state.limits.depth:
            raise InvalidFilter(
                f"the filter nests $and/$or more than {state.limits.depth} deep; the limit is "
                f"{state.limits.depth} (QUARRY_SEARCH__MAX_FILTER_DEPTH)"
            )
        if not isinstance(value, list) or not value:
            raise InvalidFilter(f"{key} takes a non-empty list of filter objects")
        subs: list[Filter] = []
        for sub in value:
            parsed = _parse(sub, state, depth + 1) if isinstance(sub, Mapping) else None
            if parsed is None:
                raise InvalidFilter(f"every item of {key} must be a non-empty filter object")
            subs.append(parsed)
        return And(tuple(subs)) if key == "$and" else Or(tuple(subs))
    if key.startswith("$"):
        raise InvalidFilter(f"unknown filter operator {clip(key)}; use $and, $or or a field name")
    _check_field(key, state.schema, state.names)
    if not isinstance(value, Mapping):
        state.count(1)
        return Eq(key, _scalar(key, value, state.schema))
    return _parse_ops(key, value, state)


def _parse_ops(key: str, ops: Mapping[str, Any], state: _Parse) -> Filter:
    if not ops:
        raise InvalidFilter(f"the condition on {clip(key)} is empty")
    schema = state.schema
    parts: list[Filter] = []
    bounds: dict[str, float] = {}
    for op, arg in ops.items():
        if op == "$eq":
            state.count(1)
            parts.append(Eq(key, _scalar(key, arg, schema)))
        elif op == "$ne":
            state.count(1)
            parts.append(Ne(key, _scalar(key, arg, schema)))
        elif op in ("$in", "$nin"):
            if not isinstance(arg, list) or not arg:
                raise InvalidFilter(f"{op} on {clip(key)} takes a non-empty list")
            if len(arg) > state.limits.in_values:
                raise InvalidFilter(
                    f"{op} on {clip(key)} has {len(arg):,} values; the limit is {state.limits.in_values:,} "
                    "(QUARRY_SEARCH__MAX_FILTER_IN_VALUES)"
                )
            state.count(len(arg))
            values = tuple(_scalar(key, v, schema) for v in arg)
            parts.append(In(key, values) if op == "$in" else Nin(key, values))
        elif op in ("$exists", "$prefix"):
            state.count(1)
            parts.append(_presence(key, op, arg, schema))
        elif op in _RANGE_OPS:
            state.count(1)
            bounds[_RANGE_OPS[op]] = _number(key, arg, schema)
        else:
            raise InvalidFilter(
                f"unknown operator {clip(op)} on {clip(key)}; supported: $eq, $ne, $in, $nin, $gt, $gte, "
                "$lt, $lte, $exists, $prefix"
            )
    if bounds:
        parts.append(Range(key, **bounds))
    return parts[0] if len(parts) == 1 else And(tuple(parts))


def _presence(key: str, op: str, arg: Any, schema: Mapping[str, FieldType] | None) -> Filter:
    """``$exists`` (a boolean) or ``$prefix`` (a string, on a string field)."""
    if op == "$exists":
        if not isinstance(arg, bool):
            raise InvalidFilter(f"$exists on {clip(key)} takes true or false, got {clip(arg)}")
        return Exists(key, arg)
    if not isinstance(arg, str):
        raise InvalidFilter(f"$prefix on {clip(key)} takes a string, got {clip(arg)}")
    _check_text(key, arg)
    expected = schema.get(key) if schema else None
    if expected is not None and expected != "str":
        raise InvalidFilter(f"$prefix needs a string field; {clip(key)} holds {expected} values")
    return Prefix(key, arg)


def _check_field(key: str, schema: Mapping[str, FieldType] | None, names: re.Pattern[str] = FIELD_NAME) -> None:
    if not names.fullmatch(key):
        raise InvalidFilter(f"invalid field name {clip(key)}: use letters, digits and '_'")
    if schema is not None and key not in schema:
        known = ", ".join(sorted(schema)) or "(none)"
        raise InvalidFilter(f"unknown filter field {clip(key)}; known fields: {known}")


def _scalar(key: str, value: Any, schema: Mapping[str, FieldType] | None) -> Scalar:
    if not isinstance(value, str | int | float | bool) or value is None:
        raise InvalidFilter(f"the value for {clip(key)} must be a string, number or boolean")
    if isinstance(value, str):
        _check_text(key, value)
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidFilter(f"the value for {clip(key)} is {clip(value)}; filter numbers must be finite")
    expected = schema.get(key) if schema else None
    if expected is not None and field_type(value) != expected:
        if not (expected == "float" and field_type(value) == "int"):
            raise InvalidFilter(
                f"field {clip(key)} holds {expected} values, got {field_type(value)} {clip(value)}"
            )
    return value


def _number(key: str, value: Any, schema: Mapping[str, FieldType] | None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidFilter(f"range bounds on {clip(key)} must be numbers, got {clip(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidFilter(f"range bounds on {clip(key)} must be finite numbers, got {clip(value)}")
    expected = schema.get(key) if schema else None
    if expected is not None and expected not in ("int", "float"):
        raise InvalidFilter(f"range operators need a numeric field; {clip(key)} holds {expected} values")
    return value


def _check_text(key: str, value: str) -> None:
    """A filter string every engine and driver takes: valid Unicode (UTF-8 encodable), no NUL.

    Ingestion refuses both in metadata (``indexing.sources``), so such a filter could match
    nothing anyway; refused here, no mode and no backend ever sees it.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidFilter(
            f"the value for {clip(key)} holds an unpaired UTF-16 surrogate ({value[exc.start]!r}) at character "
            f"{exc.start}; send valid Unicode"
        ) from exc
    if "\x00" in value:
        raise InvalidFilter(
            f"the value for {clip(key)} holds a NUL character (\\u0000) at character {value.index(chr(0))}; "
            "remove it"
        )


def field_type(value: Any) -> FieldType:
    """The filter type of a payload value (``bool`` before ``int``; lists by their items)."""
    if isinstance(value, list):
        return field_type(value[0]) if value else "str"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return "str"


def fields_of(flt: Filter) -> set[str]:
    """Every payload field a filter reads."""
    if isinstance(flt, And | Or):
        return set().union(*(fields_of(sub) for sub in flt.items))
    return {flt.field}


def matches(flt: Filter | None, payload: Mapping[str, Any]) -> bool:
    """Evaluate ``flt`` against one payload (the reference semantics for every backend).

    A missing field (absent, ``None`` or ``[]``: see :func:`present`) matches only
    ``Exists(f, False)``. For a list-valued field, ``Eq``/``In``/
    ``Prefix`` match when any item does, ``Ne``/``Nin`` when no item equals a given value.
    """
    if flt is None:
        return True
    if isinstance(flt, And):
        return all(matches(sub, payload) for sub in flt.items)
    if isinstance(flt, Or):
        return any(matches(sub, payload) for sub in flt.items)
    if isinstance(flt, Exists):
        return present(payload, flt.field) == flt.present
    if not present(payload, flt.field):
        return False
    value = payload[flt.field]
    values = value if isinstance(value, list) else [value]
    if isinstance(flt, Eq | Ne):
        return any(_same(v, flt.value) for v in values) == isinstance(flt, Eq)
    if isinstance(flt, In | Nin):
        return any(_same(v, w) for v in values for w in flt.values) == isinstance(flt, In)
    if isinstance(flt, Prefix):
        return any(isinstance(v, str) and v.startswith(flt.prefix) for v in values)
    return _in_range(flt, value)


def predicate(flt: Filter) -> Callable[[Mapping[str, Any]], bool]:
    """:func:`matches` compiled once for a filter tested on many payloads (the BM25 channel's rows).

    Same answers as :func:`matches`; an ``Eq``/``In`` is one set lookup per payload value instead
    of a comparison with each of up to ``max_filter_in_values`` values.
    """
    if isinstance(flt, And | Or):
        subs = [predicate(sub) for sub in flt.items]
        combine = all if isinstance(flt, And) else any
        return lambda payload: combine(test(payload) for test in subs)
    field = flt.field
    if isinstance(flt, Range | Exists | Prefix):
        return lambda payload: matches(flt, payload)
    wanted = frozenset(_match_key(v) for v in ((flt.value,) if isinstance(flt, Eq | Ne) else flt.values))
    positive = isinstance(flt, Eq | In)

    def test(payload: Mapping[str, Any]) -> bool:
        if not present(payload, field):
            return False
        value = payload[field]
        found = any(_match_key(v) in wanted for v in (value if isinstance(value, list) else (value,)))
        return found == positive

    return test


def present(payload: Mapping[str, Any], field: str) -> bool:
    """Whether ``payload`` holds ``field`` with a value that is not ``None`` and not ``[]``."""
    value = payload.get(field)
    return value is not None and value != []


def _match_key(value: Any) -> tuple[str, Any]:
    """A value's identity under :func:`_same`: ``True`` is not ``1``, ``1`` is ``1.0``, ``"1"`` is neither."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("number", value)
    return ("other", value)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _in_range(flt: Range, value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return (
        (flt.gt is None or value > flt.gt)
        and (flt.gte is None or value >= flt.gte)
        and (flt.lt is None or value < flt.lt)
        and (flt.lte is None or value <= flt.lte)
    )


def canonical(flt: Filter) -> Filter:
    """The same filter in one canonical form, so that every way of writing it runs alike.

    Nested ``$or``/``$and`` are flattened, a one-item ``$or``/``$and`` is its item, and in an
    ``$or`` the equalities and ``$in`` lists on one field merge into one ``$in`` (first
    occurrence order, duplicates dropped; an ``$or`` of ten equalities otherwise compiles to ten
    index lookups or ten JSON tests per row). Semantics are unchanged (see :func:`matches`).
    """
    if not isinstance(flt, And | Or):
        return flt
    kind = type(flt)
    items: list[Filter] = []
    for sub in (canonical(s) for s in flt.items):
        items.extend(sub.items if isinstance(sub, kind) else (sub,))
    if isinstance(flt, Or):
        items = _merge_values(items)
    return items[0] if len(items) == 1 else kind(tuple(items))


def _merge_values(items: list[Filter]) -> list[Filter]:
    values: dict[str, list[Scalar]] = {}
    for sub in items:
        if isinstance(sub, Eq | In):
            found = values.setdefault(sub.field, [])
            for v in (sub.value,) if isinstance(sub, Eq) else sub.values:
                if not any(type(v) is type(w) and v == w for w in found):  # keep 1, 1.0, True apart
                    found.append(v)
    out: list[Filter] = []
    for sub in items:
        if not isinstance(sub, Eq | In):
            out.append(sub)
        elif sub.field in values:
            merged = values.pop(sub.field)
            out.append(Eq(sub.field, merged[0]) if len(merged) == 1 else In(sub.field, tuple(merged)))
    return out
