"""Write a snapshot folder so that a reader sees the old one or the new one, never a mix."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path


def replace_folder(folder: Path, write: Callable[[Path], None]) -> None:
    """Fill a fresh sibling folder with ``write(tmp)``, then swap it in for ``folder`` by renames.

    The old folder is renamed aside first and removed after the new one is in place; a process
    that crashes between the two renames leaves no ``folder`` (a reader rebuilds), never a
    half-written one.

    Raises:
        OSError: The folder cannot be written, or another process renamed its own in first
            (the temporary folder is removed).
    """
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = folder.with_name(f"{folder.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    try:
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)
