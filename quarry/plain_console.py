"""The command line's rich consoles: a terminal's width on a terminal, lines never cut when piped.

rich sizes a console from the terminal of stdin, stdout or stderr, else 80 columns, so a table
piped to a file or another program was cut to 80 columns (``6ef7… │ defa…``) or to the width of
the terminal the pipe started from. :class:`PlainConsole` is as wide as its content when its own
file is not a terminal (a table at its natural width, a line unwrapped), unless ``COLUMNS`` sets
a width. On a terminal it is rich's console, colours included.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, ConsoleDimensions

PIPE_WIDTH = 100_000
"""Columns of a console whose file is not a terminal: wide enough that nothing wraps or is cut."""


class PlainConsole(Console):
    """A rich :class:`~rich.console.Console` that never cuts its output when its file is not a terminal."""

    def __init__(self, **kwargs: Any) -> None:
        """As :class:`~rich.console.Console` (``stderr=True`` for stderr)."""
        super().__init__(**kwargs)

    @property
    def size(self) -> ConsoleDimensions:
        """The terminal's size on a terminal (or ``COLUMNS``); :data:`PIPE_WIDTH` columns otherwise."""
        dims = super().size
        if self._width is None and not self.is_terminal and not (self._environ.get("COLUMNS") or "").isdigit():
            return ConsoleDimensions(PIPE_WIDTH, dims.height)
        return dims

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        width, height = new_size
        self._width, self._height = width, height
