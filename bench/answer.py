"""Benchmark the answer path against the LLM server alone, in one run, with the same prompts.

1. The LLM server alone: each question's prompt (the one ``/answer`` built: same sources, same
   budget) streamed straight from the OpenAI-compatible server: time to first token, total.
2. ``POST /v1/collections/{name}/answer`` streamed (SSE): time to the first ``delta`` event, to
   ``done``; and non-streamed: total. Retrieval's own time comes from ``timings_ms.retrieve``.
   These phases send ``Cache-Control: no-store``: the semantic cache is neither read nor filled.
3. The semantic cache: each question asked once more (a miss: retrieval and the LLM; the answer is
   stored), at once again (a hit) and lower-cased without its final punctuation (a paraphrase;
   its hit rate is reported). Target: hit p50 <= 0.1 x miss p50 (non-streamed totals, client side).

Quarry's added time to first token is p50(answer TTFT) - p50(LLM alone TTFT); the target is at
most the retrieval p50 + 30 ms. Each phase runs over all questions in turn, so two consecutive
requests never share a whole prompt (llama.cpp reuses the KV of a common prompt prefix, which
would flatter a repeat). The app runs in this process under uvicorn (a thread), the LLM server
is external (``scripts/services/llama.sh start`` for the local SmolLM2-135M).

    python bench/answer.py [--json FILE] [--llm-url openai+http://127.0.0.1:8090/v1?model=smollm2]
                           [--docs 200] [--queries 10] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eval.beir import load_split  # noqa: E402
from generation.openai_compat import parse_url  # noqa: E402
from generation.prompt import SEPARATOR, messages_for, source_text  # noqa: E402
from indexing.sources import iter_jsonl  # noqa: E402
from quarry.api import create_app  # noqa: E402
from quarry.service import Quarry  # noqa: E402
from quarry.settings import LLMSettings, Settings  # noqa: E402

console = Console()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(values), "p95": pct(values, 0.95), "n": len(values)}


def sse(response: httpx.Response) -> Any:
    kind, data = "message", []
    for line in response.iter_lines():
        if not line:
            if data:
                yield kind, "\n".join(data)
            kind, data = "message", []
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


def llm_alone(base: str, model: str, messages: list[dict[str, str]], max_tokens: int) -> tuple[float, float]:
    body = {"model": model, "messages": messages, "stream": True, "max_tokens": max_tokens, "temperature": 0, "seed": 7}
    started = time.perf_counter()
    ttft = None
    with httpx.stream("POST", f"{base}/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for _, data in sse(r):
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if ttft is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - started
    return (ttft or float("nan")) * 1000, (time.perf_counter() - started) * 1000


def answer_stream(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, float]:
    started = time.perf_counter()
    ttft = None
    with client.stream("POST", url, json={**body, "stream": True}) as r:
        r.raise_for_status()
        for kind, data in sse(r):
            if kind == "delta" and ttft is None:
                ttft = time.perf_counter() - started
            elif kind == "error":
                raise RuntimeError(data)
            elif kind == "done":
                break
    return (ttft or float("nan")) * 1000, (time.perf_counter() - started) * 1000


def cache_phase(client: httpx.Client, url: str, questions: list[str], common: dict[str, Any]) -> dict[str, Any]:
    """Per question: a miss (stored), a repeat (hit), a lower-cased unpunctuated paraphrase."""
    miss, hit, paraphrase_hits, wrong = [], [], 0, []

    def ask(query: str) -> tuple[float, str]:
        started = time.perf_counter()
        r = client.post(url, json={"query": query, **common})
        r.raise_for_status()
        return (time.perf_counter() - started) * 1000, r.json()["cache"]

    for q in questions:
        for bucket, expected, query in ((miss, "miss", q), (hit, "hit", q)):
            ms, got = ask(query)
            bucket.append(ms)
            if got != expected:
                wrong.append(f"{expected} expected, {got}: {query}")
        paraphrase_hits += ask(q.lower().rstrip("?.! "))[1] == "hit"
    return {"miss_ms": summary(miss), "hit_ms": summary(hit), "paraphrase_hits": paraphrase_hits, "unexpected": wrong}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scifact", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--llm-url", default="openai+http://127.0.0.1:8090/v1?model=smollm2")
    parser.add_argument("--docs", type=int, default=200, help="SciFact documents ingested")
    parser.add_argument("--queries", type=int, default=10, help="SciFact test queries asked (each phase)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--context-tokens", type=int, default=600)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    base, model = parse_url(args.llm_url)
    docs = [d for _, d in zip(range(args.docs), iter_jsonl(args.scifact / "corpus.jsonl"), strict=False)]
    questions = list(load_split(args.scifact, "test").queries.values())[: args.queries]
    llm = LLMSettings(url=args.llm_url, first_token_timeout_s=120, stall_timeout_s=60, total_timeout_s=600)
    with tempfile.TemporaryDirectory() as tmp:
        quarry = Quarry(Settings(data_dir=Path(tmp), llm=llm))
        quarry.create_collection("bench", language="en")
        quarry.upsert("bench", docs)
        server = uvicorn.Server(uvicorn.Config(create_app(quarry), host="127.0.0.1", port=0, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        url = "/v1/collections/bench/answer"
        common = {"top_k": 3, "max_tokens": args.max_tokens, "temperature": 0, "seed": 7,
                  "context_tokens": args.context_tokens}
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:
                client.headers["Cache-Control"] = "no-store"
                client.post(url, json={"query": "warm up", **common}).raise_for_status()
                plain, retrieve, prompt_ms, server_ttft, prompts = [], [], [], [], []
                for q in questions:  # phase: /answer, not streamed (also gives each question's prompt)
                    started = time.perf_counter()
                    body = client.post(url, json={"query": q, **common}).json()
                    plain.append((time.perf_counter() - started) * 1000)
                    retrieve.append(body["timings_ms"]["retrieve"])
                    prompt_ms.append(body["timings_ms"]["prompt"])
                    server_ttft.append(body["timings_ms"].get("ttft", float("nan")))
                    context = SEPARATOR.join(source_text(s["number"], s["text"]) for s in body["sources"])
                    prompts.append(messages_for(q, context))
                alone = [llm_alone(base, model or "", m, args.max_tokens) for m in prompts]
                streamed = [answer_stream(client, url, {"query": q, **common}) for q in questions]
                del client.headers["Cache-Control"]
                cache = cache_phase(client, url, questions, common)
        finally:
            server.should_exit = True
            thread.join(30)
            quarry.close()

    results = {
        "llm_alone": {"ttft_ms": summary([a for a, _ in alone]), "total_ms": summary([t for _, t in alone])},
        "answer_stream": {"ttft_ms": summary([a for a, _ in streamed]), "total_ms": summary([t for _, t in streamed])},
        "answer": {"total_ms": summary(plain), "server_ttft_ms": summary(server_ttft)},
        "retrieve_ms": summary(retrieve),
        "cache": cache,
        "prompt_ms": summary(prompt_ms),
        "config": {"docs": len(docs), "queries": len(questions), "max_tokens": args.max_tokens,
                   "context_tokens": args.context_tokens, "llm_url": args.llm_url},
    }
    added = results["answer_stream"]["ttft_ms"]["p50"] - results["llm_alone"]["ttft_ms"]["p50"]
    target = results["retrieve_ms"]["p50"] + 30
    results["added_ttft_ms_p50"] = {"value": added, "target": target, "met": added <= target}

    table = Table(title=f"answer path, {len(questions)} SciFact questions, max_tokens {args.max_tokens}")
    for col in ("measure", "p50 ms", "p95 ms"):
        table.add_column(col, justify="right" if col != "measure" else "left")
    for name, s in [
        ("LLM alone: TTFT", results["llm_alone"]["ttft_ms"]), ("LLM alone: total", results["llm_alone"]["total_ms"]),
        ("/answer stream: TTFT", results["answer_stream"]["ttft_ms"]),
        ("/answer stream: total", results["answer_stream"]["total_ms"]),
        ("/answer: total", results["answer"]["total_ms"]), ("retrieval (server)", results["retrieve_ms"]),
        ("prompt building (server)", results["prompt_ms"]),
    ]:
        table.add_row(name, f"{s['p50']:.1f}", f"{s['p95']:.1f}")
    ratio = cache["hit_ms"]["p50"] / cache["miss_ms"]["p50"]
    cache["hit_over_miss_p50"] = {"value": ratio, "target": 0.1, "met": ratio <= 0.1}
    table.add_row("cache miss: total", f"{cache['miss_ms']['p50']:.1f}", f"{cache['miss_ms']['p95']:.1f}")
    table.add_row("cache hit: total", f"{cache['hit_ms']['p50']:.1f}", f"{cache['hit_ms']['p95']:.1f}")
    console.print(table)
    console.print(f"cache hit p50 / miss p50: {ratio:.4f} (target <= 0.1): {'met' if ratio <= 0.1 else 'NOT met'}; "
                  f"paraphrase hits {cache['paraphrase_hits']}/{len(questions)}")
    console.print(f"Quarry's added TTFT p50: {added:.1f} ms (target <= retrieval p50 + 30 = {target:.1f} ms): "
                  f"{'met' if added <= target else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
