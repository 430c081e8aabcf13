"""Query drift: how far a collection's recent queries have moved from a reference of its queries.

Two signals per collection, each comparing a *reference* (the first ``drift_reference_queries``
queries a version of the collection served, kept in the state of record) with the *current window* (about the
last ``drift_window_queries`` queries):

* ``centroid``: the distance between the reference's and the window's centroids of the unit query
  vectors (the vectors the search computed; nothing is embedded again), less what sampling alone
  gives, in units of the reference's spread (the root mean square distance of its queries to
  their centroid): :func:`centroid_drift`. Unitless, about 0 for the same workload.
* ``oov``: the window's mean out-of-vocabulary share minus the reference's, where a query's share
  is that of its distinct BM25 terms (the collection's own tokenizer) that no live row of the
  collection holds: :func:`oov_share`, :func:`oov_drift`. In ``[-1, 1]``.

Cost on the request path (:meth:`QueryDrift.observe`): one normalisation and two additions of
``(dim,)`` vectors; the per-profile lock is only *tried*: a query that finds it taken (another
query of the same collection adding at that instant) is left out, so a search never waits. The
window is kept as :data:`BLOCKS` sums of consecutive queries (memory ``O(BLOCKS · dim)`` per
profile, not a vector per query); it holds between ``(BLOCKS - 1) / BLOCKS`` and all of
``drift_window_queries`` queries.

Profiles are kept per store collection (a version, whose vectors come from one model): the first
search that a new version serves (a reindex's swap) starts a fresh reference, so a swap
re-baselines the drift. The last :data:`KEPT_VERSIONS` versions of a collection are kept; figures
are those of the version that served the newest dense search (:meth:`QueryDrift.serving`). A
BM25-only search adds its OOV share to that version's profile.

The references are kept in the state of record when one is given (:class:`References`,
:mod:`indexing.state_references`): a new profile first loads its version's, in a background
thread; a reference completed here is written there (the first process's is kept, and every
other adopts it). So a restart, a worker or another replica compares its queries with the same
reference, and a workload that drifted before a restart still reads as drifted after it. The
window is each process's own (the alert fires per instance). Without a state, or while it is
unreachable, the references are this process's alone.

Series (:mod:`monitoring.metrics`): ``quarry_query_drift{tenant, collection, signal}`` and
``quarry_query_drift_queries{tenant, collection, signal}``, read at scrape time.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from monitoring.metrics import DRIFTS
from quarry.settings import MonitorSettings

log = logging.getLogger(__name__)

BLOCKS = 5  # the current window is kept as this many sums of consecutive queries
KEPT_VERSIONS = 2  # profiles kept per collection (the serving version and the one before)
SIGNALS = ("centroid", "oov")
_EPS = 1e-12


# -- pure scoring ---------------------------------------------------------------------------------


def oov_share(terms: Iterable[str], known: Callable[[str], bool]) -> float | None:
    """The share of a query's distinct terms that the vocabulary does not hold.

    Args:
        terms: The query's BM25 terms (``indexing.text.tokenize`` with the collection's language).
        known: Whether a term is held by some live row of the collection.

    Returns:
        In ``[0, 1]``; ``None`` for a query without terms (it says nothing of the vocabulary).
    """
    distinct = set(terms)
    if not distinct:
        return None
    return sum(1 for t in distinct if not known(t)) / len(distinct)


def spread(total: npt.NDArray[np.float64], n: int) -> float:
    """Root mean square distance of ``n`` unit vectors to their centroid, from their sum ``(dim,)``.

    ``(1/n) Σ_i |v_i - c|² = 1 - |c|²`` for unit ``v_i`` and ``c = Σ_i v_i / n``: 0 when all
    ``n`` are equal, about 1 for vectors spread all around.

    Raises:
        ValueError: ``n < 1``.
    """
    if n <= 0:
        raise ValueError("spread of no vectors")
    centroid = total / n
    return float(np.sqrt(max(0.0, 1.0 - float(centroid @ centroid))))


def centroid_drift(
    reference: npt.NDArray[np.float64], n_reference: int, current: npt.NDArray[np.float64], n_current: int,
) -> float:
    """How far the current centroid is from the reference's, in units of the reference's spread (>= 0).

    The centroids are the means of unit query vectors. Their squared distance, less what sampling
    alone gives two windows of one workload (``σ²_r / n_r + σ²_c / n_c``, each ``σ² = 1 - |c|²``),
    over the reference's squared :func:`spread`; the root of that. About 0 for one workload
    however diverse its queries (a plain cosine distance of two centroids of isotropic vectors is
    about 1: their directions are noise); 1 when the centroids are as far apart as a reference
    query is from its centroid (root mean square).

    Args:
        reference: Sum of the reference's unit query vectors, ``(dim,)``.
        n_reference: How many they are (> 0).
        current: Sum of the current window's unit query vectors, ``(dim,)``.
        n_current: How many they are (> 0).
    """
    c_r, c_c = reference / n_reference, current / n_current
    sq_r, sq_c = float(c_r @ c_r), float(c_c @ c_c)
    sampling = max(0.0, 1.0 - sq_r) / n_reference + max(0.0, 1.0 - sq_c) / n_current
    moved = float((c_r - c_c) @ (c_r - c_c)) - sampling
    return float(np.sqrt(max(0.0, moved) / max(1.0 - sq_r, _EPS)))


def oov_drift(reference_sum: float, n_reference: int, current_sum: float, n_current: int) -> float:
    """The current window's mean OOV share minus the reference's, in ``[-1, 1]``."""
    return current_sum / n_current - reference_sum / n_reference


# -- the tracker ----------------------------------------------------------------------------------


@dataclass
class _Block:
    """Sum and count of consecutive values of one track."""

    total: npt.NDArray[np.float64]
    n: int = 0


class _Track:
    """One signal of one profile: a reference sum frozen at ``reference_n`` values, and the window's blocks.

    ``stored``: the reference is the state of record's (loaded, or written from here).
    """

    def __init__(self, reference_n: int, block_n: int) -> None:
        self.reference_n = reference_n
        self.block_n = block_n
        self.reference: npt.NDArray[np.float64] | None = None
        self.n_reference = 0
        self.blocks: deque[_Block] = deque(maxlen=BLOCKS)  # newest last
        self.stored = False

    def add(self, value: npt.NDArray[np.float64]) -> bool:
        """Add one value ``(dim,)`` (under the profile's lock); whether it completed the reference."""
        if self.reference is not None and self.reference.shape != value.shape:  # another model: start again
            self.reference, self.n_reference, self.stored = None, 0, False
            self.blocks.clear()
        completed = False
        if self.n_reference < self.reference_n:
            self.reference = value.copy() if self.reference is None else self.reference + value
            self.n_reference += 1
            completed = self.n_reference == self.reference_n
        if not self.blocks or self.blocks[-1].n >= self.block_n:
            self.blocks.append(_Block(np.zeros_like(value)))
        block = self.blocks[-1]
        block.total += value
        block.n += 1
        return completed

    def adopt(self, total: npt.NDArray[np.float64], n: int) -> None:
        """Take the state's reference (sum ``(dim,)`` of ``n`` values) as complete (under the profile's lock).

        One of another shape (another model's) is ignored.
        """
        shape = self.reference.shape if self.reference is not None else (
            self.blocks[-1].total.shape if self.blocks else None)
        if n < 1 or (shape is not None and shape != total.shape):
            return
        self.reference, self.n_reference, self.reference_n, self.stored = total.copy(), n, n, True

    def body(self) -> dict[str, Any] | None:
        """The complete reference as the state keeps it (``{"sum": [...], "n"}``), or ``None``."""
        if self.reference is None or not self.complete:
            return None
        return {"sum": [float(x) for x in self.reference], "n": self.n_reference}

    @property
    def complete(self) -> bool:
        """Whether the reference holds its ``reference_n`` values."""
        return self.n_reference >= self.reference_n

    def window(self) -> tuple[npt.NDArray[np.float64] | None, int]:
        """The current window's sum and count (under the profile's lock)."""
        if not self.blocks:
            return None, 0
        return np.sum([b.total for b in self.blocks], axis=0), sum(b.n for b in self.blocks)


@dataclass(frozen=True)
class DriftFigures:
    """One collection's drift as the serving version's profile holds it.

    Attributes:
        physical: The store collection (version) the figures are of.
        centroid: :func:`centroid_drift`, ``None`` until the reference holds ``drift_reference_queries`` vectors.
        oov: :func:`oov_drift`, ``None`` until the reference holds that many OOV shares.
        queries: Signal -> queries in the current window.
        reference: Signal -> queries in the reference.
        oov_reference: The reference's mean OOV share (``None``: none yet).
        oov_current: The window's mean OOV share (``None``: none yet).
    """

    physical: str
    centroid: float | None
    oov: float | None
    queries: dict[str, int]
    reference: dict[str, int]
    oov_reference: float | None = None
    oov_current: float | None = None

    def value(self, signal: str) -> float | None:
        """The figure of ``signal`` (``centroid`` or ``oov``)."""
        return self.centroid if signal == "centroid" else self.oov


class _Profile:
    """One version's two tracks and the lock that guards them."""

    def __init__(self, physical: str, reference_n: int, block_n: int) -> None:
        self.physical = physical
        self.lock = threading.Lock()
        self.vectors = _Track(reference_n, block_n)
        self.oov = _Track(reference_n, block_n)

    def track(self, signal: str) -> _Track:
        """The track of ``signal`` (``centroid``: the vectors; ``oov``)."""
        return self.vectors if signal == "centroid" else self.oov

    def figures(self) -> DriftFigures:
        with self.lock:
            v_ref, n_v_ref = self.vectors.reference, self.vectors.n_reference
            v_cur, n_v = self.vectors.window()
            o_ref, n_o_ref = self.oov.reference, self.oov.n_reference
            o_cur, n_o = self.oov.window()
            v_done, o_done = self.vectors.complete, self.oov.complete
        centroid = oov = o_ref_mean = o_cur_mean = None
        if v_ref is not None and v_cur is not None and v_done:
            centroid = centroid_drift(v_ref, n_v_ref, v_cur, n_v)
        if o_ref is not None and o_cur is not None:
            o_ref_mean, o_cur_mean = float(o_ref[0]) / n_o_ref, float(o_cur[0]) / n_o
            if o_done:
                oov = oov_drift(float(o_ref[0]), n_o_ref, float(o_cur[0]), n_o)
        return DriftFigures(self.physical, centroid, oov, {"centroid": n_v, "oov": n_o},
                            {"centroid": n_v_ref, "oov": n_o_ref}, o_ref_mean, o_cur_mean)


@dataclass(frozen=True)
class DriftTrigger:
    """Whether the drift alert's condition holds (see :meth:`QueryDrift.trigger`).

    Attributes:
        fired: Some signal is above its threshold with enough queries in the window.
        above: Signal -> its figure, for the signals above their threshold.
        reason: One line for logs and a reindex job's record (empty when not fired).
    """

    fired: bool
    above: dict[str, float]
    reason: str = ""


class References(Protocol):
    """Where references are kept beyond this process: the state of record (``indexing.docstore.StateStore``)."""

    def get_query_references(self, name: str, physical: str) -> dict[str, dict[str, Any]]:
        """``signal -> {"sum": [float, ...], "n": int}`` of store collection ``physical`` of collection ``name``."""
        ...

    def put_query_reference(self, name: str, physical: str, signal: str, body: dict[str, Any]) -> dict[str, Any]:
        """Keep ``body`` unless a reference of that signal is kept already; the one kept."""
        ...


class QueryDrift:
    """Per-collection query drift of one tenant view's searches; thread-safe, never blocks a search.

    Args:
        settings: ``QUARRY_MONITOR__DRIFT_*``.
        tenant: The ``tenant`` label of its series.
        references: The state of record that keeps the references (``None``: this process's memory only).
    """

    def __init__(self, settings: MonitorSettings, *, tenant: str = "default", references: References | None = None,
                 ) -> None:
        self.settings = settings
        self.tenant = tenant
        self.references = references
        self._io: ThreadPoolExecutor | None = None  # loads and writes the references (a thread, made when needed)
        self._io_lock = threading.Lock()
        self.skipped = 0  # queries left out: their profile's lock was taken
        self._block_n = max(1, -(-settings.drift_window_queries // BLOCKS))
        self._profiles: dict[str, dict[str, _Profile]] = {}  # collection -> physical -> profile, oldest first
        self._serving: dict[str, str] = {}  # collection -> physical of its newest dense search
        self._guard = threading.Lock()  # the dicts above (taken when a version is first seen)
        DRIFTS.add(self)

    def observe(
        self, collection: str, physical: str | None, vector: npt.NDArray[np.floating[Any]] | None, oov: float | None,
    ) -> None:
        """Add one search's query vector and OOV share; ``O(dim)``, never waits.

        Args:
            collection: The collection searched.
            physical: The store collection of the version whose vector this is (``None``: a
                BM25-only search; its OOV share goes to the serving version's profile).
            vector: The query vector, ``(dim,)`` (``None``: the search had none).
            oov: :func:`oov_share` of its terms (``None``: a dense-only search, or no terms).
        """
        if not self.settings.drift_enabled or (vector is None and oov is None):
            return
        unit = None
        if vector is not None:
            unit = np.asarray(vector, dtype=np.float64).ravel()
            norm = float(np.linalg.norm(unit))
            unit = unit / norm if norm > _EPS else None
        profile = self._profile(collection, physical if unit is not None else None)
        if not profile.lock.acquire(blocking=False):
            self.skipped += 1
            return
        completed = []
        try:
            if unit is not None and profile.vectors.add(unit):
                completed.append("centroid")
            if oov is not None and profile.oov.add(np.array([oov], dtype=np.float64)):
                completed.append("oov")
        finally:
            profile.lock.release()
        for signal in completed:
            self._submit(self._save, collection, profile, signal)

    # -- the references in the state of record (a background thread) ------------------------------

    def _submit(self, fn: Callable[..., None], *args: Any) -> Future[None] | None:
        if self.references is None:
            return None
        if self._io is None:
            with self._io_lock:  # not the guard: a new profile, made under it, submits its load
                if self._io is None:
                    self._io = ThreadPoolExecutor(1, thread_name_prefix="drift-references")
        return self._io.submit(fn, *args)

    def _load(self, collection: str, profile: _Profile) -> None:
        """Adopt the state's references of ``profile``'s version (before or after its own completed)."""
        assert self.references is not None  # noqa: S101 - only submitted with one
        try:
            kept = self.references.get_query_references(collection, profile.physical)
        except Exception:  # the state is down: this process's references, until the next profile
            log.warning("query drift of %r: could not read its references", collection, exc_info=True)
            return
        with profile.lock:
            for signal, body in kept.items():
                if signal in SIGNALS:
                    profile.track(signal).adopt(np.asarray(body["sum"], dtype=np.float64), int(body["n"]))

    def _save(self, collection: str, profile: _Profile, signal: str) -> None:
        """Write ``profile``'s completed ``signal`` reference; adopt the one kept (another process's first)."""
        assert self.references is not None  # noqa: S101 - only submitted with one
        with profile.lock:
            track = profile.track(signal)
            body = None if track.stored else track.body()
        if body is None:
            return
        try:
            kept = self.references.put_query_reference(collection, profile.physical, signal, body)
        except Exception:  # the state is down, or the collection was dropped: kept in memory
            log.warning("query drift of %r: could not write its %s reference", collection, signal, exc_info=True)
            return
        with profile.lock:
            profile.track(signal).adopt(np.asarray(kept["sum"], dtype=np.float64), int(kept["n"]))

    def settle(self, timeout_s: float = 10.0) -> None:
        """Wait until the references' reads and writes asked so far are done (tests, a clean shutdown)."""
        done = self._submit(lambda: None)
        if done is not None:
            done.result(timeout=timeout_s)

    def _profile(self, collection: str, physical: str | None) -> _Profile:
        """The profile a search adds to: its version's, or (``None``) the serving version's."""
        name = physical or self._serving.get(collection, collection)
        versions = self._profiles.get(collection)
        profile = None if versions is None else versions.get(name)
        if profile is not None and (physical is None or self._serving.get(collection) == physical):
            return profile
        with self._guard:
            versions = self._profiles.setdefault(collection, {})
            profile = versions.get(name)
            if profile is None:
                s = self.settings
                profile = versions[name] = _Profile(name, s.drift_reference_queries, self._block_n)
                for old in list(versions)[:-KEPT_VERSIONS]:
                    del versions[old]
                self._submit(self._load, collection, profile)
            if physical is not None:
                self._serving[collection] = physical
        return profile

    def serving(self, collection: str) -> str | None:
        """The store collection whose figures are read (that of the newest dense search), or ``None``."""
        versions = self._profiles.get(collection)
        if not versions:
            return None
        return self._serving.get(collection, next(reversed(versions)))

    def figures(self, collection: str, physical: str | None = None) -> DriftFigures | None:
        """The drift of ``physical``'s profile (``None``: :meth:`serving`), or ``None`` without one."""
        name = physical or self.serving(collection)
        profile = None if name is None else self._profiles.get(collection, {}).get(name)
        return None if profile is None else profile.figures()

    def trigger(self, collection: str, physical: str | None = None) -> DriftTrigger:
        """Whether the alert ``QuarryQueryDrift``'s condition holds now for a version of ``collection``.

        A signal counts when its figure is above its threshold (``drift_centroid_max``,
        ``drift_oov_max``) and the window holds at least ``drift_min_queries`` queries of it.
        """
        s = self.settings
        figures = self.figures(collection, physical)
        if figures is None:
            return DriftTrigger(False, {})
        limits = {"centroid": s.drift_centroid_max, "oov": s.drift_oov_max}
        above = {
            signal: value for signal in SIGNALS
            if (value := figures.value(signal)) is not None and value > limits[signal]
            and figures.queries[signal] >= s.drift_min_queries
        }
        if not above:
            return DriftTrigger(False, {})
        parts = []
        if "centroid" in above:
            parts.append(f"centroid {above['centroid']:.2f} > {s.drift_centroid_max:g} (distance of the query "
                         "centroids in reference spreads)")
        if "oov" in above:
            parts.append(f"OOV share {figures.oov_reference:.2f} -> {figures.oov_current:.2f} "
                         f"(+{above['oov']:.2f} > {s.drift_oov_max:g})")
        n = max(figures.queries[signal] for signal in above)
        reason = (f"query drift over the last {n} queries against the first {s.drift_reference_queries}: "
                  + "; ".join(parts))
        return DriftTrigger(True, above, reason)

    def collections(self) -> list[str]:
        """The collections with a profile."""
        return list(self._profiles)

    def forget(self, collection: str) -> None:
        """Drop a collection's profiles (it was dropped)."""
        with self._guard:
            self._profiles.pop(collection, None)
            self._serving.pop(collection, None)
