"""Query drift: how far a collection's recent queries have moved from a reference of its queries.

Two signals per collection, each comparing a *reference* (the first ``drift_reference_queries``
queries a version of the collection served in this process) with the *current window* (about the
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
BM25-only search adds its OOV share to that version's profile. Everything is in this process's
memory: a restart starts every reference again, and each worker or replica has its own (the alert
fires per instance).

Series (:mod:`monitoring.metrics`): ``quarry_query_drift{tenant, collection, signal}`` and
``quarry_query_drift_queries{tenant, collection, signal}``, read at scrape time.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from monitoring.metrics import DRIFTS
from quarry.settings import MonitorSettings

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
    """One signal of one profile: a reference sum frozen at ``reference_n`` values, and the window's blocks."""

    def __init__(self, reference_n: int, block_n: int) -> None:
        self.reference_n = reference_n
        self.block_n = block_n
        self.reference: npt.NDArray[np.float64] | None = None
        self.n_reference = 0
        self.blocks: deque[_Block] = deque(maxlen=BLOCKS)  # newest last

    def add(self, value: npt.NDArray[np.float64]) -> None:
        """Add one value ``(dim,)`` (under the profile's lock)."""
        if self.reference is not None and self.reference.shape != value.shape:  # another model: start again
            self.reference, self.n_reference = None, 0
            self.blocks.clear()
        if self.n_reference < self.reference_n:
            self.reference = value.copy() if self.reference is None else self.reference + value
            self.n_reference += 1
        if not self.blocks or self.blocks[-1].n >= self.block_n:
            self.blocks.append(_Block(np.zeros_like(value)))
        block = self.blocks[-1]
        block.total += value
        block.n += 1

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


class QueryDrift:
    """Per-collection query drift of one tenant view's searches; thread-safe, never blocks a search.

    Args:
        settings: ``QUARRY_MONITOR__DRIFT_*``.
        tenant: The ``tenant`` label of its series.
    """

    def __init__(self, settings: MonitorSettings, *, tenant: str = "default") -> None:
        self.settings = settings
        self.tenant = tenant
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
        try:
            if unit is not None:
                profile.vectors.add(unit)
            if oov is not None:
                profile.oov.add(np.array([oov], dtype=np.float64))
        finally:
            profile.lock.release()

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
