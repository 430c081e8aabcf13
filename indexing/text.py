r"""Text analysis for BM25: the same function runs at index and at query time.

A text is split into runs of CJK characters and runs of everything else:

* latin runs: lowercased ``\\w+`` words; for ``en`` and ``auto``, English stopwords (bm25s'
  list) are dropped and the rest Snowball-stemmed (PyStemmer), as Lucene's EnglishAnalyzer does;
  for ``zh`` they are only lowercased.
* CJK runs: for ``zh`` and ``auto``, segmented with jieba in search mode (words plus the
  dictionary sub-words of long words); Chinese stopwords dropped. Every character bigram of
  the run is added as a separate term (prefixed ``#``), as Lucene's CJKBigramFilter does, so a
  two-character query term still matches where jieba cut the text differently (早茶 inside
  "早/茶文化"). For ``en``, CJK falls back to single characters.

The language is chosen per collection and stored with it, so indexing and querying agree.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from functools import lru_cache
from typing import Literal

import jieba
import Stemmer
from bm25s.stopwords import STOPWORDS_CHINESE, STOPWORDS_EN

Language = Literal["en", "zh", "auto"]
LANGUAGES: tuple[Language, ...] = ("en", "zh", "auto")

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef"
_RUNS = re.compile(f"([{_CJK}]+)")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_CJK_ONLY = re.compile(f"\\A[{_CJK}]+\\Z")
_EN_STOP = frozenset(STOPWORDS_EN)
_ZH_STOP = frozenset(STOPWORDS_CHINESE)
_jieba_lock = threading.Lock()
_jieba_ready = False
_stemmer_local = threading.local()


def _stemmer() -> Stemmer.Stemmer:
    # PyStemmer objects are not thread-safe: one per thread.
    stemmer: Stemmer.Stemmer | None = getattr(_stemmer_local, "stemmer", None)
    if stemmer is None:
        stemmer = Stemmer.Stemmer("english")
        _stemmer_local.stemmer = stemmer
    return stemmer


def _ensure_jieba() -> None:
    global _jieba_ready
    if not _jieba_ready:
        with _jieba_lock:
            if not _jieba_ready:
                jieba.setLogLevel(60)
                jieba.initialize()
                _jieba_ready = True


def tokenize(text: str, language: Language) -> list[str]:
    """Analyse one text into BM25 terms.

    Args:
        text: Any Unicode text.
        language: ``en``, ``zh`` or ``auto`` (see the module docstring).

    Returns:
        Terms in order of appearance (duplicates kept: term frequency matters).
    """
    terms: list[str] = []
    for run in _RUNS.split(text):
        if not run:
            continue
        if _CJK_ONLY.fullmatch(run):
            terms.extend(_cjk_terms(run, language))
        else:
            terms.extend(_latin_terms(run, language))
    return terms


def _latin_terms(run: str, language: Language) -> list[str]:
    words = [w.lower() for w in _WORD.findall(run)]
    if language == "zh":
        return words
    kept = [w for w in words if w not in _EN_STOP]
    return list(_stemmer().stemWords(kept))


def _cjk_terms(run: str, language: Language) -> Iterator[str]:
    if language == "en":
        yield from run
        return
    _ensure_jieba()
    words = _cut_short(run) if len(run) <= 32 else jieba.cut_for_search(run, HMM=True)
    for word in words:
        if word not in _ZH_STOP:
            yield word
    for i in range(len(run) - 1):
        yield "#" + run[i : i + 2]


def long_word(text: str, limit: int) -> re.Match[str] | None:
    """The first word of ``text`` longer than ``limit`` characters, as :func:`tokenize` reads words.

    A word is a run of letters and digits outside CJK runs (those are cut into words of their
    own). Linear in ``len(text)``: a match may start at the start of a word only.

    Returns:
        The match (``start()`` is the word's character offset), or ``None``.
    """
    return _long_word(limit).search(text)


@lru_cache(maxsize=8)
def _long_word(limit: int) -> re.Pattern[str]:
    letter = f"[^\\W_{_CJK}]"
    return re.compile(f"(?<!{letter}){letter}{{{limit + 1}}}")


@lru_cache(maxsize=65536)
def _cut_short(run: str) -> tuple[str, ...]:
    # Queries and short runs repeat; long document runs are cut once and not cached.
    return tuple(jieba.cut_for_search(run, HMM=True))
