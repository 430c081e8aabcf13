"""Gray release of a collection's next version: the rollout record and its policy, as pure functions.

A rollout serves a built candidate version beside the live one (:mod:`quarry.services.rollout`
runs it). Its states:

* ``shadow``: every query is served by the live version; a sample of them also runs on the
  candidate, off the request path, and the two answers are compared (top-10 overlap);
* ``canary``: ``percent`` % of routing keys are served by the candidate, sticky: a key's
  bucket is a hash of the key and the rollout's salt (:func:`bucket`), so a key never flips
  between versions within a step, and every replica routes a key alike;
* ``live``: promoted (the candidate is the collection's live version);
* ``rolled_back``: aborted by hand or by a failing gate; the live version serves all.

A routing key is the request's API key id, else a hash of the query text (:func:`routing_key`).
The ramp (:attr:`Rollout.schedule`, e.g. 5 -> 25 -> 50 -> 100 %) advances one step at a time;
each step is held until the candidate has served ``step_samples`` queries, then its gates
(:func:`evaluate`) compare the candidate with the live version over the same window: latency
p95/p99 ratios, error and degraded rates, sampled recall against exact search, top-10 overlap
on shadowed queries, and, where clients send feedback on what they were served, the thumbs-down
share and the click-through rate (a one-sided two-proportion z-test, :func:`worse_share_p`).
Nothing here reads a clock, a store or a database.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

RolloutState = Literal["shadow", "canary", "live", "rolled_back"]
ACTIVE: tuple[RolloutState, ...] = ("shadow", "canary")
DEFAULT_SCHEDULE: tuple[float, ...] = (5.0, 25.0, 50.0, 100.0)
_BUCKETS = 10_000  # a key's bucket in [0, 10000): percentages to 0.01 %


@dataclass(frozen=True)
class Gates:
    """A step's gates: the candidate passes when every figure is within its bound.

    Attributes:
        max_p95_ratio: Candidate p95 latency over live p95 (dimensionless).
        max_p99_ratio: Candidate p99 latency over live p99.
        max_error_delta: Candidate error rate minus live error rate (absolute share, 0..1).
        max_degraded_delta: Candidate degraded rate minus live degraded rate (absolute share).
        min_recall: Mean sampled recall@k of the candidate against exact search (0..1).
        min_recall_ratio: Candidate mean recall over live mean recall (when live has samples).
        min_overlap: Mean top-10 overlap of shadowed queries with the other version (0..1).
        min_latency_samples: Queries of each version before the latency ratios count.
        min_recall_samples: Recall samples of the candidate before the recall gate counts.
        min_overlap_samples: Shadowed pairs before the overlap gate counts.
        max_down_delta: Candidate thumbs-down share of rated requests minus live's (absolute, 0..1);
            fails only when the difference is also significant (``feedback_alpha``).
        max_click_drop: Live click-through rate (requests with a click on a hit, of those served)
            minus the candidate's (absolute, 0..1); fails only when significant too.
        min_feedback_samples: Rated requests of each version (for clicks: clicked requests of both)
            before a feedback gate counts. Fewer: the gate is *skipped*, not pending (clients may
            send no feedback at all; it never holds the ramp).
        min_feedback_keys: Distinct senders of each version's feedback (API keys, or requests
            without one) before a feedback gate counts, else skipped: a canary routes a key
            wholly to one version, so a gate compares populations of keys, and a few keys would
            compare clients (an app that never clicks, a batch job), not versions.
        feedback_alpha: Significance level of the one-sided two-proportion z-test a feedback gate
            needs before it fails (a worse share by chance alone does not roll back).
    """

    max_p95_ratio: float = 2.0
    max_p99_ratio: float = 3.0
    max_error_delta: float = 0.01
    max_degraded_delta: float = 0.05
    min_recall: float = 0.9
    min_recall_ratio: float = 0.95
    min_overlap: float = 0.6
    min_latency_samples: int = 20
    min_recall_samples: int = 5
    min_overlap_samples: int = 5
    max_down_delta: float = 0.1
    max_click_drop: float = 0.1
    min_feedback_samples: int = 20
    min_feedback_keys: int = 5
    feedback_alpha: float = 0.05

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> Gates:
        """Gates from a JSON object (unknown keys ignored, missing ones at their defaults)."""
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in (raw or {}).items() if k in known})


@dataclass(frozen=True)
class Rollout:
    """A collection's rollout as the state of record keeps it (one row per collection: the newest).

    Attributes:
        collection: The collection's name.
        candidate: The candidate's version number.
        baseline: The live version when the rollout started (a promote needs it still live).
        state: See the module doc.
        percent: The candidate's share of routing keys in ``canary`` (0..100).
        step: Index of ``percent`` in ``schedule`` (``-1``: shadow, before the first step).
        schedule: The ramp, percentages ascending, the last one ``100``.
        step_samples: Candidate-served (or, in shadow, shadowed) queries a step is held for
            before its gates are evaluated.
        shadow_rate: Share of queries also run on the other version (0..1).
        auto: Whether a step whose gates pass advances by itself (the last step promotes).
        gates: The gates' bounds (:class:`Gates` as JSON).
        salt: Mixed into the routing hash (a new rollout re-draws who is in the canary).
        synced_seq: The collection's change-log position the candidate holds.
        started_at, updated_at, step_started_at: Unix seconds.
        decisions: Every decision taken, oldest first: ``{"at", "action", "by", "step", "percent",
            "passed", "failed", "figures", "reason"}`` (the gate's figures when one was evaluated).
    """

    collection: str
    candidate: int
    baseline: int
    state: RolloutState
    percent: float = 0.0
    step: int = -1
    schedule: tuple[float, ...] = DEFAULT_SCHEDULE
    step_samples: int = 200
    shadow_rate: float = 0.05
    auto: bool = False
    gates: dict[str, Any] = field(default_factory=dict)
    salt: str = ""
    synced_seq: int = 0
    started_at: float = 0.0
    updated_at: float = 0.0
    step_started_at: float = 0.0
    decisions: tuple[dict[str, Any], ...] = ()

    @property
    def active(self) -> bool:
        """Whether the candidate still takes traffic (shadow or canary)."""
        return self.state in ACTIVE

    def to_json(self) -> dict[str, Any]:
        """A JSON object of every field (``schedule`` and ``decisions`` as lists)."""
        out = asdict(self)
        out["schedule"], out["decisions"] = list(self.schedule), list(self.decisions)
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Rollout:
        """The inverse of :meth:`to_json`."""
        data = dict(raw)
        data["schedule"] = tuple(float(p) for p in data.get("schedule", DEFAULT_SCHEDULE))
        data["decisions"] = tuple(data.get("decisions", ()))
        return cls(**data)


def check_schedule(schedule: Sequence[float]) -> tuple[float, ...]:
    """The ramp as given, checked: strictly ascending percentages in ``(0, 100]``, the last one ``100``.

    Raises:
        ValueError: An empty ramp, a share out of range, not ascending, or not ending at 100.
    """
    steps = tuple(float(p) for p in schedule)
    if not steps:
        raise ValueError("the schedule needs at least one step (its last one 100)")
    if any(not 0.0 < p <= 100.0 for p in steps):
        raise ValueError(f"every step must be a percentage in (0, 100], got {list(steps)}")
    if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        raise ValueError(f"the steps must ascend, got {list(steps)}")
    if steps[-1] != 100.0:
        raise ValueError(f"the last step must be 100 (the candidate serves everything), got {steps[-1]:g}")
    return steps


def routing_key(api_key_id: str | None, query: str) -> str:
    """The key a query is routed by: the API key id, else the query text (case and spaces folded)."""
    if api_key_id:
        return f"k:{api_key_id}"
    return "q:" + " ".join(query.lower().split())


def bucket(key: str, salt: str) -> float:
    """A key's place in ``[0, 100)`` (percent, to 0.01): SHA-256 of ``salt`` and ``key``, uniform."""
    digest = hashlib.sha256(f"{salt}\x00{key}".encode()).digest()
    return (int.from_bytes(digest[:8], "big") % _BUCKETS) / (_BUCKETS / 100.0)


def serves_candidate(rollout: Rollout | None, key: str) -> bool:
    """Whether ``key``'s query goes to the candidate: a canary and the key's bucket under its percent."""
    if rollout is None or rollout.state != "canary":
        return False
    return bucket(key, rollout.salt) < rollout.percent


def next_step(rollout: Rollout) -> tuple[int, float] | None:
    """The step after ``rollout``'s (index, percent); ``None`` after the last one (time to promote)."""
    nxt = rollout.step + 1
    if nxt >= len(rollout.schedule):
        return None
    return nxt, rollout.schedule[nxt]


def stepped(rollout: Rollout, now: float) -> Rollout:
    """``rollout`` moved to its next step (a shadow becomes a canary at the first step).

    Raises:
        ValueError: It is on its last step already (promote it), or it is not active.
    """
    if not rollout.active:
        raise ValueError(f"the rollout of {rollout.collection!r} is {rollout.state}: nothing to step")
    nxt = next_step(rollout)
    if nxt is None:
        raise ValueError(f"the rollout of {rollout.collection!r} is on its last step ({rollout.percent:g} %): "
                         "promote it")
    return replace(rollout, state="canary", step=nxt[0], percent=nxt[1], updated_at=now, step_started_at=now)


@dataclass
class Figures:
    """One version's figures over a step's window (what the gates read).

    Attributes:
        queries: Queries it served.
        errors: Of those, failed (a backend error).
        degraded: Of those, answered degraded (e.g. BM25 alone).
        latencies_ms: Each served query's latency, milliseconds.
        recall: Sampled recall@k values of its searches against exact search.
        overlap: Top-10 overlap of its shadowed answers with the other version's (0..1 each).
        rated: Of the queries it served, those a client rated (thumbs up or down).
        down: Of those, rated down.
        clicked: Of the queries it served, those with a client's click on one of their hits.
        click_queries: The queries it served to the routing keys that sent a click in the window
            (the click-through's denominator: a key that never clicks says nothing of it).
        clickers: How many such keys it served (each key-less request one).
        raters: Distinct senders of its ratings (API keys; each key-less request one).
    """

    queries: int = 0
    errors: int = 0
    degraded: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    recall: list[float] = field(default_factory=list)
    overlap: list[float] = field(default_factory=list)
    rated: int = 0
    down: int = 0
    clicked: int = 0
    click_queries: int = 0
    clickers: int = 0
    raters: int = 0

    def summary(self) -> dict[str, Any]:
        """The figures as JSON; a figure without data is ``None``.

        Keys: ``queries``, ``error_rate``, ``degraded_rate``, ``p95_ms``, ``p99_ms``, ``recall``,
        ``recall_samples``, ``overlap``, ``overlap_samples``, ``rated``, ``raters``, ``down_rate``
        (of the rated), ``clicked``, ``click_queries``, ``clickers``, ``click_rate`` (of ``click_queries``).
        """
        return {
            "queries": self.queries,
            "error_rate": self.errors / self.queries if self.queries else None,
            "degraded_rate": self.degraded / self.queries if self.queries else None,
            "p95_ms": percentile(self.latencies_ms, 95), "p99_ms": percentile(self.latencies_ms, 99),
            "recall": _mean(self.recall), "recall_samples": len(self.recall),
            "overlap": _mean(self.overlap), "overlap_samples": len(self.overlap),
            "rated": self.rated, "raters": self.raters, "down_rate": self.down / self.rated if self.rated else None,
            "clicked": self.clicked, "click_queries": self.click_queries, "clickers": self.clickers,
            "click_rate": self.clicked / self.click_queries if self.click_queries else None,
        }


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (nearest rank, ``q`` in 0..100) of ``values``; ``None`` when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return float(ordered[rank - 1])


def _mean(values: Sequence[float]) -> float | None:
    return float(sum(values) / len(values)) if values else None


@dataclass(frozen=True)
class Decision:
    """A gate evaluation: passed or not, which gates failed and why, the figures it read.

    ``pending`` names the gates that had too few samples to count (they neither pass nor fail,
    and hold an ``auto`` ramp); ``skipped``, the feedback gates without enough feedback (they hold
    nothing: clients may send none).
    """

    passed: bool
    failed: tuple[str, ...]
    pending: tuple[str, ...]
    reasons: tuple[str, ...]
    figures: dict[str, Any]
    skipped: tuple[str, ...] = ()


def worse_share_p(bad: int, n: int, base_bad: int, base_n: int) -> float:
    """One-sided p-value that the share ``bad / n`` exceeds ``base_bad / base_n`` by more than chance.

    The pooled two-proportion z-test (e.g. Agresti, *Categorical Data Analysis*, 3rd ed., 3.1.3):
    ``z = (p1 - p2) / sqrt(p (1 - p) (1/n + 1/base_n))`` with ``p`` the pooled share; the p-value
    is ``P(Z >= z)``. ``1.0`` when either count is 0 or both shares are 0 or 1 (nothing to tell).
    """
    if n <= 0 or base_n <= 0:
        return 1.0
    pooled = (bad + base_bad) / (n + base_n)
    spread = math.sqrt(pooled * (1.0 - pooled) * (1.0 / n + 1.0 / base_n))
    if spread == 0.0:
        return 1.0
    z = (bad / n - base_bad / base_n) / spread
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def evaluate(candidate: Figures, live: Figures, gates: Gates) -> Decision:  # noqa: C901 - one check per gate
    """Compare the candidate's figures with the live version's over the same window.

    Returns:
        A :class:`Decision`: ``passed`` when no gate failed (pending gates do not fail it);
        ``figures`` is ``{"candidate": summary, "live": summary, "gates": bounds}`` (and, when a
        feedback gate counted, ``"feedback": {"down_p", "click_p"}``, its z-test's p-values).
    """
    c, lv = candidate.summary(), live.summary()
    failed: list[str] = []
    pending: list[str] = []
    reasons: list[str] = []
    skipped: list[str] = []
    tests: dict[str, float] = {}

    def bound(name: str, ok: bool, why: str) -> None:
        if not ok:
            failed.append(name)
            reasons.append(why)

    enough = min(candidate.queries, live.queries) >= gates.min_latency_samples
    for q, limit in ((95, gates.max_p95_ratio), (99, gates.max_p99_ratio)):
        name = f"p{q}_ratio"
        cv, lvv = c[f"p{q}_ms"], lv[f"p{q}_ms"]
        if not enough or cv is None or lvv is None:
            pending.append(name)
            continue
        ratio = cv / max(lvv, 1e-3)
        bound(name, ratio <= limit, f"p{q} latency {cv:.1f} ms is {ratio:.2f}x live's {lvv:.1f} ms (max {limit:g}x)")
    for name, key, limit in (("error_rate", "error_rate", gates.max_error_delta),
                             ("degraded_rate", "degraded_rate", gates.max_degraded_delta)):
        if not enough or c[key] is None:
            pending.append(name)
            continue
        delta = c[key] - (lv[key] or 0.0)
        bound(name, delta <= limit, f"{key.replace('_', ' ')} {c[key]:.3f} vs live {lv[key] or 0.0:.3f} "
              f"(max +{limit:g})")
    if len(candidate.recall) < gates.min_recall_samples:
        pending.append("recall")
    else:
        rc = c["recall"]
        bound("recall", rc >= gates.min_recall,
              f"sampled recall {rc:.3f} against exact search (min {gates.min_recall:g})")
        if live.recall and lv["recall"]:
            ratio = rc / lv["recall"]
            bound("recall_ratio", ratio >= gates.min_recall_ratio, f"sampled recall {rc:.3f} is {ratio:.2f}x "
                  f"live's {lv['recall']:.3f} (min {gates.min_recall_ratio:g}x)")
    if len(candidate.overlap) < gates.min_overlap_samples:
        pending.append("overlap")
    else:
        ov = c["overlap"]
        bound("overlap", ov >= gates.min_overlap, f"top-10 overlap with live {ov:.3f} (min {gates.min_overlap:g})")
    if (min(candidate.rated, live.rated) < gates.min_feedback_samples
            or min(candidate.raters, live.raters) < gates.min_feedback_keys):
        skipped.append("down_rate")
    else:
        p = tests["down_p"] = worse_share_p(candidate.down, candidate.rated, live.down, live.rated)
        delta = c["down_rate"] - lv["down_rate"]
        bound("down_rate", delta <= gates.max_down_delta or p >= gates.feedback_alpha,
              f"thumbs-down share {c['down_rate']:.3f} of {candidate.rated} rated vs live {lv['down_rate']:.3f} "
              f"of {live.rated} (max +{gates.max_down_delta:g}; one-sided p {p:.3g} < {gates.feedback_alpha:g})")
    cq, lq = candidate.click_queries, live.click_queries
    if (min(cq, lq) < gates.min_latency_samples or candidate.clicked + live.clicked < gates.min_feedback_samples
            or min(candidate.clickers, live.clickers) < gates.min_feedback_keys):
        skipped.append("click_rate")
    else:  # the share of the clicking keys' queries *without* a click, worse when higher
        p = tests["click_p"] = worse_share_p(cq - candidate.clicked, cq, lq - live.clicked, lq)
        drop = lv["click_rate"] - c["click_rate"]
        bound("click_rate", drop <= gates.max_click_drop or p >= gates.feedback_alpha,
              f"click-through {c['click_rate']:.3f} of {cq} queries of clicking keys vs live {lv['click_rate']:.3f} "
              f"of {lq} (max -{gates.max_click_drop:g}; one-sided p {p:.3g} < {gates.feedback_alpha:g})")
    figures: dict[str, Any] = {"candidate": c, "live": lv, "gates": asdict(gates)}
    if tests:
        figures["feedback"] = tests
    return Decision(not failed, tuple(failed), tuple(pending), tuple(reasons), figures, tuple(skipped))


def overlap(a: Sequence[str], b: Sequence[str], k: int = 10) -> float:
    """Share of the first ``k`` ids of ``a`` found in the first ``k`` of ``b`` (1.0 when both are empty)."""
    top_a, top_b = list(dict.fromkeys(a))[:k], set(list(dict.fromkeys(b))[:k])
    if not top_a and not top_b:
        return 1.0
    return len([i for i in top_a if i in top_b]) / max(len(top_a), len(top_b))
