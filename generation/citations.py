r"""Citation markers in an answer: parsed, resolved to the sources that were sent, and checked.

Pure functions, shared by the streaming and the non-streaming answer so that both give the same
citations. Sources are numbered ``[1]..[n]`` in the prompt; an answer's markers are read in the
forms models write:

* ``[3]``, ``[1, 2]``, ``[1-3]`` (also ``–``/``—``), ``[1 and 2]``, ``[Source 2]``, ``[doc 2]``;
* ``【3】`` (full-width brackets, common in models trained on Chinese text);
* ``(3)``, ``(1, 2)``: only numbers of at most 3 digits, so that a year, ``(2019)``, is not a marker,
  and never glued to a word or formula (``1,25(OH)(2)D``, ``H(2)O``, ``CO(2)`` hold none).

A number in ``1..n`` becomes a :class:`Citation` of that source; any other (``[3]`` with two
sources sent) is dropped and counted, never mapped to another chunk (Haystack's AnswerBuilder
drops out-of-range markers too; RAGFlow falls back to all sources, which we do not). A range
spanning more than :data:`MAX_RANGE` numbers is not expanded: its two ends count alone.

``supported`` is :func:`generation.support.check`: enough of the citing sentence's content terms
in the cited chunk (its title included; ``score`` in 0..1 against ``QUARRY_LLM__SUPPORT_THRESHOLD``,
0.5 by default), and no number, negation, opposite or named entity of the sentence that the chunk
contradicts or lacks (``reason`` says which rule failed). The citing sentence is the text from the
previous sentence end to the marker (the sentence before it when the marker opens one); a marker
with nothing before it (``[1] Title. Copied text``) cites the text after it, up to the next marker
or the end of the answer, and resolves when that text is complete.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from generation.support import check
from indexing.text import Language

MAX_RANGE = 50
_NUMS = r"\d{1,4}(?:\s*(?:,|-|–|—|and|&)\s*\d{1,4})*"
_PAR_NUMS = r"\d{1,3}(?:\s*(?:,|-|–)\s*\d{1,3})*"
_PREFIX = r"(?:(?:sources?|docs?|documents?|refs?|references?)\s*:?\s*#?)?"
MARKER = re.compile(
    rf"\[\s*{_PREFIX}(?P<sq>{_NUMS})\s*\]|【\s*{_PREFIX}(?P<cjk>{_NUMS})\s*】|(?<![\w)\]])\(\s*(?P<par>{_PAR_NUMS})\s*\)(?![\w(])",
    re.IGNORECASE,
)
_SPLIT = re.compile(r"\s*(,|-|–|—|and|&)\s*", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+|\n+")


@dataclass(frozen=True)
class Marker:
    """A marker as written: its span in the answer (character offsets) and the numbers it names."""

    start: int
    end: int
    text: str
    numbers: tuple[int, ...]


@dataclass(frozen=True)
class SourceRef:
    """What a citation needs of a source that was sent: its number and its text."""

    number: int
    document_id: str
    chunk_id: str
    text: str
    title: str | None = None


@dataclass(frozen=True)
class Citation:
    """A resolved marker number: the source it points at and whether the source backs the sentence.

    Attributes:
        marker: The source number (1-based, as in the prompt).
        text: The marker as written, e.g. ``[1, 2]``.
        start, end: The marker's span in the answer (character offsets).
        quote: The sentence of the cited chunk that shares most content terms with the citing one.
        score: The lexical support score (0..1).
        reason: Why it is not ``supported`` (the rule of :func:`generation.support.check` that
            failed), ``None`` when it is.
    """

    marker: int
    text: str
    start: int
    end: int
    document_id: str
    chunk_id: str
    title: str | None
    quote: str
    score: float
    supported: bool
    reason: str | None = None

    def to_json(self) -> dict[str, object]:
        """The citation as the API returns it."""
        return {
            "marker": self.marker, "text": self.text, "span": [self.start, self.end],
            "document_id": self.document_id, "chunk_id": self.chunk_id, "title": self.title,
            "quote": self.quote, "score": round(self.score, 4), "supported": self.supported,
            "reason": self.reason,
        }


def numbers_of(spec: str) -> tuple[int, ...]:
    """``"1, 2"`` -> (1, 2); ``"1-3"`` -> (1, 2, 3); a range wider than :data:`MAX_RANGE`: its ends."""
    parts = _SPLIT.split(spec.strip())
    out: list[int] = [int(parts[0])]
    for sep, num in zip(parts[1::2], parts[2::2], strict=True):
        n = int(num)
        if sep in "-–—" and 0 < n - out[-1] <= MAX_RANGE:
            out.extend(range(out[-1] + 1, n + 1))
        else:
            out.append(n)
    return tuple(out)


def find_markers(text: str, start: int = 0) -> list[Marker]:
    """Every complete marker of ``text`` from offset ``start`` on, in order."""
    out = []
    for m in MARKER.finditer(text, start):
        spec = m.group("sq") or m.group("cjk") or m.group("par")
        out.append(Marker(m.start(), m.end(), m.group(0), numbers_of(spec)))
    return out


def claim_of(text: str, marker_start: int) -> str:
    """The sentence a marker at ``marker_start`` cites for: from the previous sentence end to it.

    Markers right before it (``[1][2]``) are skipped; a marker that opens a sentence cites the
    sentence before it.
    """
    prefix = MARKER.sub(" ", text[:marker_start]).rstrip()
    sentences = [s for s in _SENTENCE_END.split(prefix) if s.strip()]
    return sentences[-1].strip() if sentences else ""


def support(claim: str, chunk: str, language: Language) -> tuple[float, str]:
    """Lexical support of ``claim`` by ``chunk``: (share of the claim's terms in the chunk, best quote)."""
    got = check(claim, chunk, language)
    return got.score, got.quote


class CitationScanner:
    """Resolves an answer's markers as its text grows (streaming) or all at once.

    Feeding the same text in any number of pieces, then :meth:`finish`, yields the same
    citations (a marker is taken once it is complete, i.e. closed; one that opens the answer once
    the text it cites is), which keeps streamed and non-streamed answers identical.

    Args:
        sources: The sources that were sent, numbered from 1.
        language: The collection's analysis language (for ``supported``).
        threshold: Support score at or above which a citation is ``supported``.
    """

    def __init__(self, sources: Sequence[SourceRef], language: Language, threshold: float) -> None:
        self._sources = {s.number: s for s in sources}
        self._language = language
        self._threshold = threshold
        self.text = ""
        self._pos = 0
        self._pending: list[Marker] = []  # markers with nothing before them: they cite what follows
        self.citations: list[Citation] = []
        self.dropped = 0

    def feed(self, delta: str) -> list[Citation]:
        """Append ``delta`` to the answer; the citations of the markers it completed."""
        self.text += delta
        new: list[Citation] = []
        for marker in find_markers(self.text, self._pos):
            self._pos = marker.end
            if self._pending:  # the text the opening markers cite ends at this marker
                new += self._flush(marker.start)
            claim = claim_of(self.text, marker.start)
            if not claim:
                self._pending.append(marker)
                continue
            new += self._cite(marker, claim)
        self.citations.extend(new)
        return new

    def finish(self) -> list[Citation]:
        """The answer is complete: the citations of markers still waiting for the text they cite."""
        new = self._flush(len(self.text))
        self.citations.extend(new)
        return new

    def _flush(self, end: int) -> list[Citation]:
        pending, self._pending = self._pending, []
        out: list[Citation] = []
        for marker in pending:
            claim = MARKER.sub(" ", self.text[marker.end : end]).strip()
            out += self._cite(marker, claim)
        return out

    def _cite(self, marker: Marker, claim: str) -> list[Citation]:
        out: list[Citation] = []
        for n in marker.numbers:
            source = self._sources.get(n)
            if source is None:
                self.dropped += 1
                continue
            chunk = f"{source.title}\n{source.text}" if source.title else source.text
            got = check(claim, chunk, self._language, self._threshold)
            out.append(
                Citation(
                    n, marker.text, marker.start, marker.end, source.document_id, source.chunk_id,
                    source.title, got.quote, got.score, got.supported, got.reason,
                )
            )
        return out


def resolve(answer: str, sources: Sequence[SourceRef], language: Language, threshold: float) -> CitationScanner:
    """All of ``answer``'s citations at once (see :class:`CitationScanner`)."""
    scanner = CitationScanner(sources, language, threshold)
    scanner.feed(answer)
    scanner.finish()
    return scanner
