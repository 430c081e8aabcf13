"""The BM25 scoring formulas of bm25s (Lù, 2024), vectorised: one module for both BM25 indexes.

:class:`indexing.bm25.BM25Index` lets bm25s score a snapshot (bm25s precomputes each posting's
``idf * tfc`` at index time); :class:`indexing.bm25_live.LiveView` scores at query time with the
live N, avgdl and df, so it needs the formulas themselves. They are here, written as bm25s'
``scoring._score_idf_*`` / ``_score_tfc_*`` (Kamphuis et al., ECIR 2020, which bm25s cites) but
over numpy arrays; ``tests/core/test_bm25_live.py`` checks them against bm25s' own functions.

Variants: ``robertson``, ``lucene``, ``atire``, ``bm25l``, ``bm25+`` (``BM25Settings.method``).
bm25s leaves out the constant ``(k1 + 1)`` numerator factor of Okapi's formula (rank-equivalent,
as Lucene does); both indexes multiply ``robertson`` scores by :func:`okapi_scale` to give the
textbook values.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

DELTA = 0.5
"""bm25s' default ``delta`` of ``bm25l`` and ``bm25+``."""

Floats = npt.NDArray[np.float64]


def idf(method: str, df: Floats, n: float) -> Floats:
    """bm25s' idf of each method: ``(len(df),) float64``.

    Args:
        method: The BM25 variant.
        df: Document frequency of each term (``df > 0``).
        n: Number of live rows.
    """
    if method == "lucene":
        out = np.log1p((n - df + 0.5) / (df + 0.5))
    elif method == "robertson":  # bm25s clips a negative idf to 0 (allow_negative=False)
        out = np.log(np.maximum((n - df + 0.5) / (df + 0.5), 1.0))
    elif method == "atire":
        out = np.log(n / df)
    elif method == "bm25l":
        out = np.log((n + 1) / (df + 0.5))
    else:  # bm25+
        out = np.log((n + 1) / df)
    return np.asarray(out, np.float64)


def tfc(method: str, tf: Floats, norm: Floats, k1: float) -> Floats:
    """bm25s' term-frequency component of each posting: ``(len(tf),) float64``.

    Args:
        method: The BM25 variant.
        tf: Term frequency in the row.
        norm: ``1 - b + b * dl / avgdl`` of the row (``dl``: its token count).
        k1: Saturation parameter.
    """
    if method in ("lucene", "robertson"):
        out = tf / (k1 * norm + tf)
    elif method == "atire":
        out = tf * (k1 + 1) / (tf + k1 * norm)
    elif method == "bm25l":
        c = tf / norm
        out = (k1 + 1) * (c + DELTA) / (k1 + c + DELTA)
    else:  # bm25+
        out = (k1 + 1) * tf / (k1 * norm + tf) + DELTA
    return np.asarray(out, np.float64)


def tfc_absent(method: str, k1: float) -> float:
    """The tfc of a term a row lacks (``tf = 0``): non-zero for ``bm25l`` and ``bm25+`` only.

    bm25s adds it to every row; a query-time scorer adds it once and subtracts it from holders.
    """
    if method not in ("bm25l", "bm25+"):
        return 0.0
    return float(tfc(method, np.zeros(1), np.ones(1), k1)[0])


def okapi_scale(method: str, k1: float) -> float:
    """Factor that turns bm25s' score into the textbook Okapi value: ``k1 + 1`` for ``robertson``, else 1."""
    return k1 + 1.0 if method == "robertson" else 1.0
