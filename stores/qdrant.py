"""Qdrant backends: the real engine in process (qdrant-edge) and qdrant-client (server, local).

======================================  ==========================================================
URL                                     store
======================================  ==========================================================
``qdrant:///abs/dir``                   :class:`QdrantEdgeStore`: Qdrant's engine in process
                                        (``qdrant-edge-py``): real HNSW, payload indexes, shards
                                        persisted on disk. The engine under test.
                                        ``?search_threads=N`` sizes each shard's search pool.
``qdrant://host:6333``                  :class:`QdrantClientStore` on a Qdrant server (REST;
                                        ``qdrant://:API_KEY@host:6333`` passes an API key).
``qdrant+local:///abs/dir``             :class:`QdrantClientStore` on qdrant-client's local mode:
                                        a brute-force emulation that runs the server code path.
======================================  ==========================================================

Shared conventions (:mod:`stores.qdrant_filters`): point ids are ``uuid5`` of the caller's id,
which is kept in the payload under ``_id``; filters compile to structured ``Filter`` models.
Scores: cosine similarity, dot product, and ``-distance`` for ``l2`` (Qdrant's ``Euclid``
returns the distance, smaller first).

Indexes: Qdrant builds HNSW (``M``, ``efConstruction``; search ``ef``) with optional int8 scalar
or product quantization (``params["quantization"]``: ``int8``/``pq``, ``compression``), and
searches exactly (``FLAT``: ``exact=True``). Until :meth:`build_index` runs, a collection has no
index and is searched exactly. A segment smaller than ``full_scan_threshold_kb`` (default
10,000 KiB: about 51k vectors of dim 50, 6.6k of dim 384) is scanned exactly even with an HNSW
config, and so is a filtered search whose candidate set is that small (through the payload
index); the build sets the indexing threshold to the same value, so no graph is built that
would never be walked. Pass a smaller ``full_scan_threshold_kb`` (>= 10) to walk the graph on
small collections.

Filtered searches: Qdrant plans a filtered search from its own cardinality estimate,
which depends on the filter's form (a ``$in`` on numbers is a ``should`` of ranges, a range is
estimated from a histogram). The store routes by an exact count of the matching points instead
(the payload indexes answer it; :class:`stores.routing.FilterRouter`, cached per filter), the
same for every form: at most the limit (``StoreSettings.exact_filter_rows``, by default
``max(1000, sqrt(13 * top_k * n))``), ``exact=True``, which scores only the matching points;
above it, the graph with the filter and ACORN. An ``$or`` of equalities on one field is one
``MatchAny`` (:func:`stores.filters.canonical`). On 20k x 32 with a walked graph, 1 % selected
as a 100-value ``$in``: 27 ms and recall 0.982 before, 0.8 ms and 1.0 after (an equality:
0.8 ms before, 0.08 ms after). qdrant-client's local mode is exact anyway and is not routed.

Payload indexes: every filterable payload field gets one on first sight (keyword for strings,
float for numbers, bool for booleans), built with ``enable_hnsw=False``. Qdrant's default adds
payload-aware graph links for every value held by more points than the full-scan threshold;
on GloVe-100k a ``tag`` field whose one value covers 99 % of the rows halved unfiltered QPS
(4,480 -> 2,061 at ef=64) and lengthened the build by 30 %. Filtered graph searches instead
ask for ACORN (two-hop expansion, applied by Qdrant below 40 % selectivity): without links
and without ACORN a 1 % filter walked on the graph returned 1-2 hits instead of 10; with
ACORN, 10 hits at recall 0.98.

Edge specifics (qdrant-edge-py 0.9.0; checks in ``tests/stores/test_qdrant.py``):

* Layout: ``<root>/collections/<name>/shard`` (one ``EdgeShard``), ``.../meta.json`` (dim,
  metric, index spec), and ``<root>/aliases.json``: edge has no aliases, so the alias map is that
  file, replaced atomically (write, fsync, ``os.replace``). One store owns a root (each shard's
  WAL is locked; a second store gets ``StoreUnavailable``), so the in-process view is
  authoritative.
* Vectors and graph are pinned in RAM (``Memory.Pinned``; the default mmap placement gave 2.5x
  fewer QPS) unless ``params["on_disk"]``; payloads are cached.
* Edge never optimizes on its own: new points land in an appendable, exactly-searched segment
  until the next :meth:`QdrantEdgeStore.build_index`, which runs ``EdgeShard.optimize()``.
* ``optimize()`` holds the GIL for the whole build (a 51 s build froze every thread for 51 s):
  a thread cannot time it out. Builds therefore run in a child process that opens the shard
  with the new config; on failure or timeout the child is killed, the previous
  ``edge_config.json`` restored and the shard reopened (Qdrant drops unfinished
  ``temp_segments`` on load). While a build runs, that collection answers ``StoreUnavailable``.
* The binding turns a Python ``bool`` in ``MatchValue`` into ``0``/``1``, so boolean fields are
  mirrored as keywords under ``_bools`` (hidden from callers; ``_id``/``_bools`` are reserved).

Thread safety: one store may be shared by the threads of a server. Edge searches release the
GIL and its shard is thread safe, so data calls run concurrently under a shared lock, and
collection/alias/index changes take it exclusively. Local mode is serialised under a lock; the
server client is not locked (``httpx`` is thread safe).

qdrant-client local mode commits every point to SQLite (about 27 ms per point on this disk):
fine for the contract suite, not for bulk loads.
"""


from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from quarry.errors import ConfigError
from stores.base import VectorStore
from stores.qdrant_common import abs_path
from stores.qdrant_edge import QdrantEdgeStore, optimize_child
from stores.qdrant_remote import QdrantClientStore
from stores.routing import FilterRouter

__all__ = ["QdrantClientStore", "QdrantEdgeStore", "open_qdrant", "optimize_child"]


def open_qdrant(url: str, router: FilterRouter | None = None) -> VectorStore:
    """Open the Qdrant store a URL names (see the module table); ``router`` routes filtered searches.

    Raises:
        ConfigError: The URL names neither an absolute path nor a host, or an extra is missing.
        StoreUnavailable: The server cannot be reached, or another process holds the path.
    """
    parts = urlsplit(url)
    if parts.scheme.lower() == "qdrant+local":
        if parts.netloc:
            raise ConfigError(f"{url!r}: local mode takes a path, e.g. qdrant+local:///abs/dir")
        return QdrantClientStore.local(abs_path(parts.path, url))
    if parts.hostname:
        return QdrantClientStore.remote(parts.hostname, parts.port or 6333, parts.password, router)
    return QdrantEdgeStore(abs_path(parts.path, url), search_threads=_search_threads(url, parts.query), router=router)


def _search_threads(url: str, query: str) -> int | None:
    """``?search_threads=N`` of an embedded URL (Qdrant's ``max_search_threads``), else ``None``."""
    options = parse_qs(query, keep_blank_values=True)
    unknown = set(options) - {"search_threads"}
    if unknown:
        raise ConfigError(f"{url!r}: unknown option(s) {', '.join(sorted(unknown))}; qdrant:/// takes search_threads")
    if "search_threads" not in options:
        return None
    raw = options["search_threads"][-1]
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{url!r}: search_threads must be a positive integer, got {raw!r}")
    return int(raw)
