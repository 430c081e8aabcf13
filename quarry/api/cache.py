"""The answer routes' cache directives: what a request's headers let the semantic cache do.

Bypass: ``Cache-Control: no-cache`` (or ``max-age=0``) or ``X-Quarry-Cache: bypass`` skip the
lookup (a bypassed answer is still stored, replacing the entry of the same question, unless
``no-store``). ``Cache-Control: no-store`` alone is looked up as any request (``hit`` or
``miss``) and its answer is not stored. The cache itself is the answer service's
(:mod:`quarry.services.answer_cache`).
"""

from __future__ import annotations

from collections.abc import Mapping

from quarry.services.answer_cache import CacheUse


def directives(headers: Mapping[str, str]) -> CacheUse:
    """What ``headers`` let the cache do, as HTTP caches read them (RFC 9111, 5.2.1).

    ``no-cache`` and ``max-age=0`` (no stored answer is fresh enough) and ``X-Quarry-Cache:
    bypass`` skip the lookup; ``no-store`` keeps this answer out of the cache, and only that:
    a stored answer may still serve it (a request's ``no-store`` forbids storing, not reading).
    """
    control = {}
    for directive in headers.get("cache-control", "").split(","):
        name, _, value = directive.strip().partition("=")
        control[name.lower()] = value.strip().strip('"')
    bypass = headers.get("x-quarry-cache", "").strip().lower() == "bypass"
    read = not (bypass or "no-cache" in control or control.get("max-age") == "0")
    return CacheUse(read, "no-store" not in control)
