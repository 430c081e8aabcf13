"""The command line's consoles: output that is not a terminal is never cut to 80 columns."""

from __future__ import annotations

import io

import pytest
from rich.table import Table

from quarry.plain_console import PIPE_WIDTH, PlainConsole


def _table() -> Table:
    table = Table("id", "tenant", "scopes")
    table.add_row("6ef7a1c2d3e4f5a6b7c8d9e0f1a2b3c4", "default-tenant-with-a-long-name", "read,write,admin" * 4)
    return table


def test_a_piped_table_is_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    console = PlainConsole(file=io.StringIO())
    console.print(_table())
    text = console.file.getvalue()
    assert console.width == PIPE_WIDTH
    assert "…" not in text and "6ef7a1c2d3e4f5a6b7c8d9e0f1a2b3c4" in text and "read,write,admin" * 4 in text
    assert max(len(line) for line in text.splitlines()) > 80


def test_columns_still_sets_the_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    console = PlainConsole(file=io.StringIO())
    console.print(_table())
    assert console.width == 60 and max(len(line) for line in console.file.getvalue().splitlines()) <= 60


def test_an_explicit_width_wins() -> None:
    console = PlainConsole(file=io.StringIO(), width=100)
    assert console.width == 100
    console.size = (120, 30)
    assert console.width == 120
