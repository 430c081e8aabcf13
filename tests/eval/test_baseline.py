"""The committed-baseline regression check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eval.baseline import compare_to_baseline
from eval.summary import ModeResult, Summary
from quarry.errors import ConfigError


def summary(ndcg: float, recall: float) -> Summary:
    metrics = {"ndcg@10": ndcg, "recall@10": recall / 2, "recall@100": recall, "mrr@10": ndcg}
    result = ModeResult("hybrid", metrics, {"q": metrics}, {"q": 12.5})
    return Summary(config={"split": "test"}, modes={"hybrid": result})


def write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_no_regression_within_tolerance_or_on_improvement(tmp_path: Path) -> None:
    base = write(tmp_path / "base.json", summary(0.72, 0.95).to_dict())
    assert compare_to_baseline(summary(0.72, 0.95), base) == []
    assert compare_to_baseline(summary(0.711, 0.941), base) == []
    assert compare_to_baseline(summary(0.80, 0.99), base) == []


def test_drops_beyond_tolerance_are_listed(tmp_path: Path) -> None:
    base = write(tmp_path / "base.json", summary(0.72, 0.95).to_dict())
    got = compare_to_baseline(summary(0.70, 0.95), base)
    assert got == ["hybrid ndcg@10: 0.7000 < baseline 0.7200 - 0.0100"]
    got = compare_to_baseline(summary(0.70, 0.90).to_dict(), base, tolerance=0.001)
    assert [line.split(":")[0] for line in got] == [
        "hybrid ndcg@10",
        "hybrid recall@10",
        "hybrid recall@100",
    ]


def test_missing_mode_is_a_regression_and_new_mode_is_not(tmp_path: Path) -> None:
    data = summary(0.72, 0.95).to_dict()
    data["modes"]["bm25"] = data["modes"]["hybrid"]
    base = write(tmp_path / "base.json", data)
    assert compare_to_baseline(summary(0.72, 0.95), base) == [
        "bm25: mode missing from this run (baseline has it)"
    ]
    data["modes"] = {}
    assert compare_to_baseline(summary(0.1, 0.1), write(tmp_path / "empty.json", data)) == []


def test_unreadable_baseline(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read baseline"):
        compare_to_baseline(summary(0.7, 0.9), tmp_path / "absent.json")
    with pytest.raises(ConfigError, match="no 'modes' object"):
        compare_to_baseline(summary(0.7, 0.9), write(tmp_path / "bad.json", {"config": {}}))
