r"""Compile typed filters (:mod:`stores.filters`) to Milvus boolean expressions, safely.

Milvus Lite 2.5.1 rejects expression templates (``filter_params``), so values are written as
escaped literals; nothing of the caller's text reaches the expression unescaped:

* field names must match :data:`stores.filters.PAYLOAD_KEY` and are read as ``payload["f"]``;
* strings are double-quoted with ``\`` and ``"`` escaped. A line break cannot appear raw in a
  Milvus string literal: the server (Go parser) decodes ``\n``/``\r`` escapes, Milvus Lite does
  not, so on Lite a filter string containing a line break is rejected (``InvalidFilter``);
* numbers are written with ``repr`` (finite only), booleans as ``true``/``false``.

Reference semantics are :func:`stores.filters.matches`: for a list-valued payload field,
``Eq``/``In`` hold when any item does, so they compile to ``== v or json_contains(...)``.
``$ne``, ``$nin``, ``$exists`` and ``$prefix`` (:class:`~stores.filters.Ne`, ``Nin``,
``Exists``, ``Prefix``) take the id-set route on Lite and server alike: Milvus Lite rejects
``not (...)`` and ``exists``, and ``like`` treats ``_`` as an unescapable wildcard. The store
reads the payloads, evaluates the condition with :func:`stores.filters.matches`
(:func:`stores.routing.scanned_ids`, at most ``QUARRY_STORE__MAX_SCAN_IDS``) and the condition
compiles to ``id in [...]`` (an empty set to ``id in ["%no"]``, a key :func:`encode_id` never
produces).
Primary keys are encoded by :func:`encode_id` because pymilvus and Milvus Lite paste ids into
expressions and SQL unescaped (a ``'`` in an id breaks Lite's upsert).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

from quarry.errors import InvalidFilter
from stores.filters import PAYLOAD_KEY, And, Eq, Exists, Filter, In, Ne, Nin, Or, Prefix, Range, Scalar

_ID_UNSAFE = re.compile(r"[%'\"\\\x00-\x1f\x7f]")
_ID_ESCAPE = re.compile(r"%([0-9A-F]{2})")


def encode_id(raw: str) -> str:
    r"""Encode a caller's id as a Milvus primary key (``%XX`` for ``% ' " \`` and controls).

    Reversible with :func:`decode_id`; ids without those characters are unchanged.
    """
    return _ID_UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", raw)


def decode_id(key: str) -> str:
    """Invert :func:`encode_id`."""
    if "%" not in key:  # the common case, on the hot path of every search hit
        return key
    return _ID_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), key)


def quote_str(value: str, *, lite: bool) -> str:
    """A Milvus double-quoted string literal for ``value``.

    Raises:
        InvalidFilter: ``value`` contains a line break and the engine is Milvus Lite.
    """
    if lite and ("\n" in value or "\r" in value):
        raise InvalidFilter("Milvus Lite cannot match filter strings that contain line breaks")
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\n", "\\n").replace("\r", "\\r") + '"'


def literal(value: Scalar, *, lite: bool) -> str:
    """A Milvus literal for a scalar filter value.

    Raises:
        InvalidFilter: A non-finite number, or see :func:`quote_str`.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidFilter(f"filter numbers must be finite, got {value!r}")
        return repr(value)
    if isinstance(value, str):
        return quote_str(value, lite=lite)
    raise InvalidFilter(f"unsupported filter value {value!r}")


def ids_expr(keys: Sequence[str]) -> str:
    """``id in [...]`` over already-encoded primary keys."""
    return "id in [" + ", ".join(quote_str(k, lite=False) for k in keys) + "]"


NO_ID = '"%no"'
"""A primary key no record has (``%`` followed by non-hex digits)."""
ScanIds = Callable[[Filter], list[str]]
"""The record ids whose payload matches a condition (the store's scan)."""


def compile_filter(flt: Filter, *, lite: bool, scan: ScanIds | None = None) -> str:
    """Compile a typed filter to a Milvus expression over the ``payload`` JSON field.

    Args:
        flt: The typed filter.
        lite: Target is Milvus Lite (stricter string literals).
        scan: Resolves ``$ne``/``$nin``/``$exists``/``$prefix`` into record ids (``None``:
            they are refused).

    Returns:
        A boolean expression, e.g. ``(payload["year"] >= 2000 and payload["year"] < 2010)``.

    Raises:
        InvalidFilter: Bad field name, non-finite number, or an unrepresentable string.
    """
    if isinstance(flt, And | Or):
        joiner = " and " if isinstance(flt, And) else " or "
        return "(" + joiner.join(compile_filter(sub, lite=lite, scan=scan) for sub in flt.items) + ")"
    ref = _field(flt.field)
    if isinstance(flt, Eq):
        lit = literal(flt.value, lite=lite)
        return f"({ref} == {lit} or json_contains({ref}, {lit}))"
    if isinstance(flt, In):
        return _compile_in(ref, flt.values, lite=lite)
    if isinstance(flt, Ne | Nin | Exists | Prefix):
        if scan is None:
            raise InvalidFilter(unsupported(flt, "Milvus"))
        keys = [encode_id(i) for i in scan(flt)]
        return ids_expr(keys) if keys else f"id in [{NO_ID}]"
    return _compile_range(ref, flt)


def unsupported(flt: Filter, engine: str) -> str:
    """The message of a filter operator a backend cannot run yet."""
    op = {Ne: "$ne", Nin: "$nin", Exists: "$exists", Prefix: "$prefix"}.get(type(flt), type(flt).__name__)
    return (
        f"{op} (on {flt.field!r}) is not supported by the {engine} backend yet; "  # type: ignore[union-attr]
        "use $eq/$in/ranges here, or a pgvector collection"
    )


def _field(name: str) -> str:
    if not PAYLOAD_KEY.fullmatch(name):
        raise InvalidFilter(f"invalid field name {name!r}: use letters, digits and '_'")
    return f'payload["{name}"]'


def _compile_in(ref: str, values: tuple[Scalar, ...], *, lite: bool) -> str:
    # Milvus asserts on an ``in`` list of mixed types: one clause per value type.
    groups: dict[type, list[str]] = {}
    for value in values:
        groups.setdefault(type(value), []).append(literal(value, lite=lite))
    parts = []
    for lits in groups.values():
        joined = ", ".join(lits)
        parts.append(f"{ref} in [{joined}] or json_contains_any({ref}, [{joined}])")
    return "(" + " or ".join(parts) + ")"


def _compile_range(ref: str, flt: Range) -> str:
    ops = (("gt", ">"), ("gte", ">="), ("lt", "<"), ("lte", "<="))
    parts = []
    for attr, op in ops:
        bound = getattr(flt, attr)
        if bound is None:
            continue
        if isinstance(bound, bool) or not isinstance(bound, int | float):
            raise InvalidFilter(f"range bounds on {flt.field!r} must be numbers, got {bound!r}")
        parts.append(f"{ref} {op} {literal(bound, lite=False)}")
    if not parts:
        raise InvalidFilter(f"the range on {flt.field!r} has no bound")
    return "(" + " and ".join(parts) + ")"
