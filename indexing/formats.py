"""Text out of PDF, HTML and DOCX files (the ``formats`` extra: ``pip install quarry[formats]``).

Each parser returns a :class:`Parsed`: a title, the text, and its sections (character offsets
where a page or a heading's section starts, with the metadata its chunks carry). The chunker
never lets a chunk cross a section boundary (:func:`indexing.chunking.chunk_sections`).

Libraries, and why these:

* **PDF: pypdf** (BSD, pure Python, no system library). Text per page is all we need and pypdf's
  ``extract_text`` is several times faster than pdfplumber's (pdfplumber runs pdfminer.six's full
  layout analysis for every character, which we would throw away); PyMuPDF is faster still but
  AGPL. A page gives ``{"page": n}`` (1-based), so an answer can cite "p. 4".
* **HTML: trafilatura** (Apache-2.0). It finds the main text and drops navigation, footers and
  other boilerplate (the best-scoring open extractor in the ScrapingHub and Bevendorff et al. 2023
  benchmarks); selectolax is a faster parser but leaves boilerplate removal to us. The title
  comes from trafilatura's metadata (``<title>``, ``og:title``), else the file name.
* **DOCX: python-docx** (MIT), the reference reader of Office Open XML. A paragraph styled
  ``Heading n`` or ``Title`` starts a section: its chunks carry ``{"section": "<heading>"}``.

Raises of every parser: :class:`FormatError` (the file is damaged, encrypted or holds no text);
:class:`~quarry.errors.ConfigError` when the extra is not installed.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quarry.errors import ConfigError, InvalidDocument
from stores.base import Payload

FORMAT_SUFFIXES = (".pdf", ".html", ".htm", ".docx")
PAGE_SEPARATOR = "\n\n"


class FormatError(InvalidDocument):
    """A file of a supported format that cannot be parsed (damaged, encrypted, no text)."""


@dataclass(frozen=True)
class Section:
    """Where a part of a document starts, and what its chunks carry.

    Attributes:
        start: Character offset in the document's text (inclusive).
        metadata: Merged into the payload of every chunk of the section (``page``, ``section``).
    """

    start: int
    metadata: Payload = field(default_factory=dict)


@dataclass(frozen=True)
class Parsed:
    """A parsed file: ``title``, ``text`` and its ``sections`` (offsets ascending, first at 0)."""

    title: str
    text: str
    sections: tuple[Section, ...] = ()


def _need(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"reading this format needs {module}: pip install 'quarry[formats]'") from exc


def _join(parts: list[tuple[str, Payload]]) -> tuple[str, tuple[Section, ...]]:
    """Join texts with blank lines; each non-blank one is a section starting at its offset."""
    text, sections = "", []
    for part, meta in parts:
        part = part.strip()
        if not part:
            continue
        if text:
            text += PAGE_SEPARATOR
        sections.append(Section(len(text), meta))
        text += part
    return text, tuple(sections)


def parse_pdf(path: Path) -> Parsed:
    """Text per page; each page is a section ``{"page": n}`` (1-based).

    Raises:
        FormatError: Not a PDF, damaged, encrypted, or no page has text (a scan needs OCR first).
    """
    pypdf = _need("pypdf")
    logging.getLogger("pypdf").setLevel(logging.ERROR)  # warnings about odd but readable files
    try:
        reader = pypdf.PdfReader(path)
        if reader.is_encrypted:
            raise FormatError("the PDF is encrypted", source=str(path))
        pages: list[tuple[str, Payload]] = [
            (page.extract_text() or "", {"page": n}) for n, page in enumerate(reader.pages, start=1)
        ]
        title = str((reader.metadata or {}).get("/Title") or "").strip()
    except FormatError:
        raise
    except Exception as exc:  # noqa: BLE001 - pypdf raises many types for damaged files
        raise FormatError(f"not a readable PDF: {type(exc).__name__}: {exc}", source=str(path)) from exc
    text, sections = _join(pages)
    if not text:
        raise FormatError(f"none of its {len(pages)} pages has text (a scan needs OCR first)", source=str(path))
    return Parsed(title or path.stem, text, sections)


def parse_html(path: Path) -> Parsed:
    """Main text and title, navigation and boilerplate dropped (trafilatura).

    Raises:
        FormatError: No main text found.
    """
    trafilatura = _need("trafilatura")
    raw = path.read_bytes()
    try:
        doc = trafilatura.bare_extraction(raw, with_metadata=True, include_comments=False, include_tables=True)
    except Exception as exc:  # noqa: BLE001 - lxml errors of all kinds
        raise FormatError(f"not readable HTML: {type(exc).__name__}: {exc}", source=str(path)) from exc
    text = (getattr(doc, "text", None) or "").strip() if doc is not None else ""
    if not text:
        raise FormatError("no main text found in the page", source=str(path))
    title = (getattr(doc, "title", None) or "").strip()
    return Parsed(title or path.stem, text, (Section(0, {}),))


def parse_docx(path: Path) -> Parsed:
    """Paragraphs and tables; each ``Heading n`` paragraph starts a section ``{"section": heading}``.

    Raises:
        FormatError: Not a DOCX (a zip of Office Open XML), damaged, or without text.
    """
    docx = _need("docx")
    try:
        document = docx.Document(io.BytesIO(path.read_bytes()))
    except Exception as exc:  # noqa: BLE001 - zipfile, lxml and python-docx errors
        raise FormatError(f"not a readable DOCX: {type(exc).__name__}: {exc}", source=str(path)) from exc
    title = (document.core_properties.title or "").strip()
    parts: list[tuple[str, Payload]] = []
    heading = ""
    lines: list[str] = []
    for paragraph in document.paragraphs:
        style = (paragraph.style.name if paragraph.style is not None else "") or ""
        text = paragraph.text.strip()
        if style == "Title" and text and not title:
            title = text
            continue
        if style.startswith("Heading") and text:
            parts.append(("\n".join(lines), {"section": heading} if heading else {}))
            heading, lines = text, [text]
            continue
        if text:
            lines.append(text)
    parts.append(("\n".join(lines), {"section": heading} if heading else {}))
    for table in document.tables:
        rows = ["\t".join(cell.text.strip() for cell in row.cells) for row in table.rows]
        parts.append(("\n".join(rows), {"section": heading} if heading else {}))
    text, sections = _join(parts)
    if not text:
        raise FormatError("the document holds no text", source=str(path))
    return Parsed(title or path.stem, text, sections)


PARSERS = {".pdf": parse_pdf, ".html": parse_html, ".htm": parse_html, ".docx": parse_docx}
