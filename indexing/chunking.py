"""Token-window chunking with overlap.

Tokens here are text tokens, not model word-pieces: runs of word characters, one token per CJK
character, and single punctuation marks. A chunk is the slice of the source text from its first
token's start to its last token's end, so

* every chunk is a contiguous slice of its source (``source[start:end] == chunk.text``),
* a chunk never holds more than ``size`` tokens (a hard cap),
* consecutive chunks share exactly ``overlap`` tokens, and ``overlap >= size`` is rejected.

A document with sections (a PDF's pages, a DOCX's heading sections) is chunked section by
section (:func:`chunk_sections`): no chunk crosses a section boundary, and there is no overlap
across one; positions run on through the whole document.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from quarry.errors import InvalidRequest

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef"
_TOKEN = re.compile(f"[{_CJK}]|[^\\W{_CJK}]+|[^\\w\\s]", re.UNICODE)


@dataclass(frozen=True)
class Chunk:
    """A slice of a source text.

    Attributes:
        position: 0-based index of the chunk within its document.
        start: Character offset of the first character (inclusive).
        end: Character offset after the last character (exclusive).
        text: ``source[start:end]``.
    """

    position: int
    start: int
    end: int
    text: str


def chunk_text(text: str, size: int, overlap: int) -> list[Chunk]:
    """Split ``text`` into windows of at most ``size`` tokens sharing ``overlap`` tokens.

    Args:
        text: Source text.
        size: Hard cap on tokens per chunk, ``>= 1``.
        overlap: Tokens shared by consecutive chunks, ``0 <= overlap < size``.

    Returns:
        Chunks in order; empty when the text has no token.

    Raises:
        InvalidRequest: ``size < 1``, ``overlap < 0`` or ``overlap >= size``.
    """
    if size < 1:
        raise InvalidRequest(f"chunk size must be >= 1, got {size}")
    if not 0 <= overlap < size:
        raise InvalidRequest(f"chunk overlap must be >= 0 and < size ({size}), got {overlap}")
    spans = [m.span() for m in _TOKEN.finditer(text)]
    chunks: list[Chunk] = []
    step = size - overlap
    first = 0
    while first < len(spans):
        last = min(first + size, len(spans)) - 1
        start, end = spans[first][0], spans[last][1]
        chunks.append(Chunk(len(chunks), start, end, text[start:end]))
        if last == len(spans) - 1:
            break
        first += step
    return chunks


def chunk_sections(text: str, starts: Sequence[int], size: int, overlap: int) -> list[tuple[int, Chunk]]:
    """Chunk each section ``text[starts[i]:starts[i + 1]]`` on its own.

    Args:
        text: Source text.
        starts: Section start offsets, ascending; empty means one section (the whole text).
        size: Hard cap on tokens per chunk.
        overlap: Tokens shared by consecutive chunks of a section.

    Returns:
        ``(section index, chunk)`` pairs; chunk offsets are into ``text`` and positions run
        0, 1, ... through the document.

    Raises:
        InvalidRequest: As :func:`chunk_text`.
    """
    if not starts:
        return [(0, c) for c in chunk_text(text, size, overlap)]
    bounds = [*starts, len(text)]
    out: list[tuple[int, Chunk]] = []
    for i in range(len(starts)):
        lo = bounds[i]
        for piece in chunk_text(text[lo : bounds[i + 1]], size, overlap):
            out.append((i, Chunk(len(out), lo + piece.start, lo + piece.end, piece.text)))
    return out


def count_tokens(text: str) -> int:
    """Number of chunking tokens in ``text``."""
    return sum(1 for _ in _TOKEN.finditer(text))


def make_chunk_id(document_id: str, position: int, digest: str) -> str:
    """Deterministic chunk id ``<document id>:<position>:<content hash>``.

    Args:
        document_id: The source document's id (may itself contain ``:``).
        position: 0-based index of the chunk in its document.
        digest: Hex hash of the indexed text (title + chunk); no ``:`` in it.
    """
    return f"{document_id}:{position}:{digest}"


def document_id_of(chunk_id: str) -> str:
    """The document id a :func:`make_chunk_id` id was made from (the part before its last two ``:``)."""
    return chunk_id.rsplit(":", 2)[0]
