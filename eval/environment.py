"""What an evaluation ran on: Quarry's version and commit, the hardware, how latency was timed.

Recorded in ``summary.json["config"]["environment"]`` by :func:`eval.runner.evaluate`, so that two
runs' figures can be told apart by what produced them. Everything is read locally, without the
network: the version from the installed distribution's metadata, the commit from ``git`` (when the
code runs from a checkout), the CPU from ``/proc/cpuinfo`` (Linux) or :func:`platform.processor`,
the memory from ``sysconf``, the GPU from ``nvidia-smi`` when it is on ``PATH``.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parents[1]
_TIMEOUT_S = 5.0

LATENCY_METHOD = (
    "wall-clock time of each search call in the evaluating process (time.perf_counter_ns before and "
    "after the call; for `quarry eval` the call is Quarry.search in process: query embedding, both "
    "channels, fusion and hydration, no HTTP), one query at a time, after {warmup} untimed warm-up "
    "call(s) per mode; p50/p95 over the judged non-blank queries"
)
"""How ``latency_ms`` was measured (``{warmup}`` is filled in by :func:`environment`)."""


def _run(args: list[str]) -> str | None:
    """The stdout of a command, stripped; None when it is missing, fails or takes over 5 s."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def quarry_version() -> str:
    """The installed ``quarry`` distribution's version, or ``"unknown"`` when not installed."""
    try:
        return version("quarry")
    except PackageNotFoundError:
        return "unknown"


def git_commit(repo: Path = _REPO) -> dict[str, Any] | None:
    """The checkout's commit and whether its tracked files differ from it.

    Args:
        repo: A folder inside the checkout (default: the one this package runs from).

    Returns:
        ``{"commit": 40 hex digits, "dirty": bool}``, or None outside a git checkout or without git.
    """
    if shutil.which("git") is None:
        return None
    commit = _run(["git", "-C", str(repo), "rev-parse", "HEAD"])
    if not commit:
        return None
    status = _run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"])
    return {"commit": commit, "dirty": bool(status)}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (AttributeError, ValueError, OSError):
        return None


def _gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    listed = _run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    return [line.strip() for line in (listed or "").splitlines() if line.strip()]


def hardware() -> dict[str, Any]:
    """The machine: CPU model, logical cores (and those this process may use), memory, GPUs.

    Returns:
        ``{"cpu": str, "cores": int, "cores_usable": int, "memory_gib": float | None,
        "gpus": [str], "platform": str, "python": str}``.
    """
    cores = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    return {
        "cpu": _cpu_model(),
        "cores": cores,
        "cores_usable": usable,
        "memory_gib": _memory_gib(),
        "gpus": _gpus(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def environment(warmup: int) -> dict[str, Any]:
    """Everything above, as recorded in a run's config.

    Args:
        warmup: Untimed warm-up calls per mode (named in the latency method).

    Returns:
        ``{"quarry_version", "git", "hardware", "latency_method"}``; ``git`` is None outside a checkout.
    """
    return {
        "quarry_version": quarry_version(),
        "git": git_commit(),
        "hardware": hardware(),
        "latency_method": LATENCY_METHOD.format(warmup=warmup),
    }
