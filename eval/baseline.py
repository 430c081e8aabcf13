"""Regression check of an evaluation run against a committed baseline ``summary.json``.

CI runs the evaluation, then calls :func:`compare_to_baseline` with the baseline committed in the
repository; a non-empty result means a quality metric dropped by more than the tolerance.
Latency is not compared: it depends on the machine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eval.summary import Summary, summary_modes
from quarry.errors import ConfigError

DEFAULT_CHECKED: tuple[str, ...] = ("ndcg@10", "recall@10", "recall@100")


def load_summary_json(path: Path) -> dict[str, Any]:
    """Read a ``summary.json`` file.

    Args:
        path: The file.

    Returns:
        Its parsed content, a dict with a ``"modes"`` object.

    Raises:
        ConfigError: The file is missing, is not JSON, or has no ``"modes"`` object.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read baseline summary {path}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("modes"), dict):
        raise ConfigError(f"baseline summary {path} has no 'modes' object")
    return data


def compare_to_baseline(
    summary: Summary | Mapping[str, Any],
    baseline_path: Path,
    tolerance: float = 0.01,
    metrics: Sequence[str] = DEFAULT_CHECKED,
) -> list[str]:
    """List the regressions of a run against a baseline ``summary.json``.

    A regression is a checked metric of a baseline mode that is lower in ``summary`` by more
    than ``tolerance`` (absolute), or a baseline mode or metric that ``summary`` lacks.
    Modes that only ``summary`` has are new, not regressions. Improvements are not reported.

    Args:
        summary: The current run (a :class:`Summary` or a parsed ``summary.json``).
        baseline_path: The committed baseline ``summary.json``.
        tolerance: Allowed absolute drop, e.g. ``0.01`` = one nDCG point.
        metrics: Metric names to check; default nDCG@10, Recall@10 and Recall@100.

    Returns:
        One human-readable line per regression, e.g.
        ``"hybrid ndcg@10: 0.7012 < baseline 0.7213 - 0.0100"``; empty when none.

    Raises:
        ConfigError: The baseline file is missing or malformed.
    """
    current = summary_modes(summary)
    regressions: list[str] = []
    for mode, base_entry in summary_modes(load_summary_json(baseline_path)).items():
        if mode not in current:
            regressions.append(f"{mode}: mode missing from this run (baseline has it)")
            continue
        for metric in metrics:
            if metric not in base_entry:
                continue
            base = float(base_entry[metric])
            value = current[mode].get(metric)
            if value is None:
                regressions.append(f"{mode} {metric}: missing from this run (baseline {base:.4f})")
            elif float(value) < base - tolerance:
                regressions.append(
                    f"{mode} {metric}: {float(value):.4f} < baseline {base:.4f} - {tolerance:.4f}"
                )
    return regressions
