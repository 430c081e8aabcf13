"""Published reference numbers for a dataset, read from ``shared/data/REFERENCE_SCORES.md``.

The file has one ``## <Dataset> (...)`` section per dataset, each with a Markdown table whose
header names at least ``system``, ``nDCG@10`` and ``R@100`` (plus ``source`` and maybe
``status``). A dataset folder matches a section when its name, lower-cased with everything but
letters and digits removed, equals the section title before its first ``(`` treated the same way
(``scifact`` -> ``## SciFact (5,183 docs, ...)``), or when the heading names
``shared/data/<folder>``. Cells are kept as text; a cell that starts with a number also gives a
float (``"0.7440 (DuckDB) / 0.6800 (PostgreSQL)"`` -> 0.744; ``"n/r"`` -> None).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

LOG = logging.getLogger(__name__)
_NUMBER = re.compile(r"^\s*(\d+(?:\.\d+)?)")
_COLUMNS = {
    "system": ("system",),
    "ndcg": ("ndcg@10",),
    "recall": ("r@100", "recall@100"),
    "source": ("source",),
    "status": ("status",),
}


@dataclass(frozen=True)
class ReferenceRow:
    """One published result.

    Attributes:
        system: The system as named in the table.
        ndcg_at_10: nDCG@10 when the cell starts with a number, else None.
        recall_at_100: Recall@100 when the cell starts with a number, else None.
        ndcg_text: The nDCG@10 cell as written.
        recall_text: The R@100 cell as written.
        source: Where the number comes from.
        status: ``verified``/``cited``/``sanity only``/... ("" when the table has no column).
    """

    system: str
    ndcg_at_10: float | None
    recall_at_100: float | None
    ndcg_text: str
    recall_text: str
    source: str
    status: str = ""


@dataclass(frozen=True)
class References:
    """The reference section found for a dataset.

    Attributes:
        heading: The section title, or None when no section matched (or no file).
        rows: Its table rows, in file order.
        notes: The section's text outside tables (e.g. "no published numbers"). The reports show
            it only for a section without numbers (why there are none); beside numbers it is the
            file curator's commentary, not the run's.
    """

    heading: str | None = None
    rows: list[ReferenceRow] = field(default_factory=list)
    notes: str = ""


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _number(cell: str) -> float | None:
    match = _NUMBER.match(cell)
    return float(match.group(1)) if match else None


def _column_index(header: list[str]) -> dict[str, int] | None:
    """Map our column keys to header positions; None if system/nDCG/R@100 are not all there."""
    lowered = [h.lower() for h in header]
    index = {
        key: next((i for i, h in enumerate(lowered) if h in names), -1)
        for key, names in _COLUMNS.items()
    }
    return None if min(index["system"], index["ndcg"], index["recall"]) < 0 else index


def _row(cells: list[str], index: dict[str, int]) -> ReferenceRow:
    def cell(key: str) -> str:
        i = index[key]
        return cells[i] if 0 <= i < len(cells) else ""

    return ReferenceRow(
        system=cell("system"),
        ndcg_at_10=_number(cell("ndcg")),
        recall_at_100=_number(cell("recall")),
        ndcg_text=cell("ndcg"),
        recall_text=cell("recall"),
        source=cell("source"),
        status=cell("status"),
    )


def _matches(heading: str, dataset: str) -> bool:
    title = heading.split("(", 1)[0]
    return _norm(title) == _norm(dataset) or f"shared/data/{dataset.lower()}" in heading.lower()


def _parse_section(heading: str, lines: list[str]) -> References:
    rows: list[ReferenceRow] = []
    notes: list[str] = []
    index: dict[str, int] | None = None
    for line in lines:
        if not line.lstrip().startswith("|"):
            index = None
            if line.strip():
                notes.append(line.strip())
            continue
        cells = _cells(line)
        if index is None:
            index = _column_index(cells) or {}
        elif index and not all(set(c) <= set("-: ") for c in cells):
            rows.append(_row(cells, index))
    return References(heading=heading, rows=rows, notes=" ".join(notes))


def parse_reference_scores(markdown: str, dataset: str) -> References:
    """Find the reference section of ``dataset`` in the text of a REFERENCE_SCORES.md.

    Args:
        markdown: The file's text.
        dataset: The dataset folder name, e.g. ``"scifact"`` or ``"cmrc2018-retrieval"``.

    Returns:
        The first matching section (rows may be empty), or an empty :class:`References`.
    """
    sections: list[tuple[str, list[str]]] = []
    for line in markdown.splitlines():
        if line.startswith("## "):
            sections.append((line[3:].strip(), []))
        elif sections:
            sections[-1][1].append(line)
    for heading, lines in sections:
        if _matches(heading, dataset):
            return _parse_section(heading, lines)
    return References()


def load_references(path: Path | None, dataset: str) -> References:
    """Read the published numbers of ``dataset`` from a REFERENCE_SCORES.md file.

    Args:
        path: The file; None or a missing file give no references (not an error).
        dataset: The dataset folder name, e.g. ``"scifact"``.

    Returns:
        The dataset's references, empty when the file or section does not exist.
    """
    if path is None or not path.is_file():
        return References()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:  # optional: a broken file costs only the comparison
        LOG.warning("ignoring %s (published numbers left out of the report): %s", path, exc)
        return References()
    return parse_reference_scores(text, dataset)
