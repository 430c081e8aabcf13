"""Benchmark ``/v1/chat/completions`` against the LLM server alone: a first question, and a follow-up.

One run, the same prompts, phases alternated:

1. Warm-up (untimed): each SciFact test question through ``/answer`` (not streamed), which gives
   its prompt (the sources sent; rebuilt with :func:`generation.prompt.messages_for`), its
   retrieval time and the answer the follow-up's conversation quotes.
2. Per round, three phases, each over all the questions in turn (two consecutive requests never
   share a whole prompt: llama.cpp reuses the KV of a common prefix, which would flatter a
   repeat), in an order that alternates between rounds:
   * ``llm_alone``: the question's prompt streamed straight from the OpenAI-compatible server;
   * ``answer_stream``: the question through ``/answer`` streamed (the path before chat: the baseline
     of "the first question's TTFT is unchanged");
   * ``chat_first``: the question as a one-message chat, streamed (no rewrite: no LLM call added);
   * ``chat_follow_up``: the conversation [question, its answer, a follow-up such as "and in
     children?"], streamed: the rewrite (an LLM call, or the rules' fallback) comes first.
   Time to first token is measured at the client (the first non-empty content delta). Chat
   requests send ``Cache-Control: no-store`` (the semantic cache neither read nor filled).

Target (the answer path's, ``bench/answer.py``): Quarry's added TTFT, p50(chat first TTFT) -
p50(LLM alone TTFT), at most retrieval p50 + 30 ms. The follow-up's cost is reported apart: its
TTFT over the LLM alone's, and the rewrite's own time (``quarry.rewrite.ms``) and method.

    python bench/chat.py [--json FILE] [--llm-url openai+http://127.0.0.1:8090/v1?model=smollm2 | stub]
                         [--docs 200] [--queries 8] [--rounds 2] [--max-tokens 8]

``--llm-url stub``: the scripted OpenAI-compatible server of the tests (``tests/generation/stub.py``,
which answers at once), so Quarry's own added time is measured without a real model's noise (a
loaded llama.cpp server's TTFT varies by seconds between two identical requests).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
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
from quarry.settings import LLMSettings, OpenAISettings, Settings  # noqa: E402

console = Console()
FOLLOW_UPS = ("and in children?", "what about older adults?", "is it the same in mice?", "how strong is the evidence?")


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": statistics.median(values), "p95": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
            "n": len(values)}


def frames(response: httpx.Response) -> Any:
    for line in response.iter_lines():
        if line.startswith("data:"):
            data = line[5:].strip()
            if data == "[DONE]":
                return
            yield json.loads(data)


def streamed(client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[float, dict]:
    """(ms to the first content delta, the first frame's ``quarry`` extension) of one streamed completion."""
    started = time.perf_counter()
    ttft, extension = None, {}
    with client.stream("POST", url, json={**body, "stream": True}, headers=headers) as r:
        r.raise_for_status()
        for chunk in frames(r):
            if "error" in chunk:
                raise RuntimeError(chunk)
            extension = extension or chunk.get("quarry") or {}
            if ttft is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - started
    return (ttft or float("nan")) * 1000, extension


def main() -> None:  # noqa: C901, PLR0915 - one linear run
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scifact", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--llm-url", default="openai+http://127.0.0.1:8090/v1?model=smollm2")
    parser.add_argument("--docs", type=int, default=200)
    parser.add_argument("--queries", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--context-tokens", type=int, default=600)
    parser.add_argument("--rewrite-timeout-s", type=float, default=5.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    stub = None
    if args.llm_url == "stub":
        from tests.generation.stub import StubLLM

        stub = StubLLM().start()
        args.llm_url = stub.url
    base, model = parse_url(args.llm_url)
    docs = [d for _, d in zip(range(args.docs), iter_jsonl(args.scifact / "corpus.jsonl"), strict=False)]
    questions = list(load_split(args.scifact, "test").queries.values())[: args.queries]
    llm = LLMSettings(url=args.llm_url, first_token_timeout_s=120, stall_timeout_s=60, total_timeout_s=600)
    limits = OpenAISettings(rewrite_timeout_s=args.rewrite_timeout_s)
    knobs = {"top_k": 3, "context_tokens": args.context_tokens}
    sampling = {"max_tokens": args.max_tokens, "temperature": 0, "seed": 7}
    with tempfile.TemporaryDirectory() as tmp:
        quarry = Quarry(Settings(data_dir=Path(tmp), llm=llm, openai=limits))
        quarry.create_collection("bench", language="en")
        quarry.upsert("bench", docs)
        server = uvicorn.Server(uvicorn.Config(create_app(quarry), host="127.0.0.1", port=0, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        no_store = {"Cache-Control": "no-store"}
        times: dict[str, list[float]] = {"llm_alone": [], "chat_first": [], "chat_follow_up": [], "answer_stream": []}
        rewrite_ms: list[float] = []
        methods: Counter[str] = Counter()
        retrieve: list[float] = []
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as client, \
                    httpx.Client(base_url=base, timeout=600) as direct:
                prompts, answers = [], []
                for q in questions:
                    body = client.post("/v1/collections/bench/answer", headers=no_store,
                                       json={"query": q, **knobs, **sampling}).json()
                    retrieve.append(body["timings_ms"]["retrieve"])
                    context = SEPARATOR.join(source_text(s["number"], s["text"]) for s in body["sources"])
                    prompts.append(messages_for(q, context))
                    answers.append(body["answer"] or "I do not know.")

                def alone(i: int) -> float:
                    return streamed(direct, "/chat/completions",
                                    {"model": model or "", "messages": prompts[i], **sampling}, {})[0]

                def first(i: int) -> float:
                    chat = {"model": "quarry/bench", "messages": [{"role": "user", "content": questions[i]}],
                            "quarry": knobs, **sampling}
                    return streamed(client, "/v1/chat/completions", chat, no_store)[0]

                def follow_up(i: int) -> float:
                    turns = [{"role": "user", "content": questions[i]}, {"role": "assistant", "content": answers[i]},
                             {"role": "user", "content": FOLLOW_UPS[i % len(FOLLOW_UPS)]}]
                    ttft, extension = streamed(client, "/v1/chat/completions",
                                               {"model": "quarry/bench", "messages": turns, "quarry": knobs,
                                                **sampling}, no_store)
                    rewrite_ms.append(extension["rewrite"]["ms"])
                    methods[f"{extension['rewrite']['method']}: {extension['rewrite']['reason']}"] += 1
                    return ttft

                def answer(i: int) -> float:
                    started = time.perf_counter()
                    with client.stream("POST", "/v1/collections/bench/answer", headers=no_store,
                                       json={"query": questions[i], **knobs, **sampling, "stream": True}) as r:
                        for line in r.iter_lines():
                            if line.startswith("event:") and line[6:].strip() == "delta":
                                return (time.perf_counter() - started) * 1000
                    return float("nan")

                phases = {"llm_alone": alone, "chat_first": first, "chat_follow_up": follow_up, "answer_stream": answer}
                orders = (("chat_first", "llm_alone", "answer_stream", "chat_follow_up"),
                          ("llm_alone", "chat_follow_up", "chat_first", "answer_stream"),
                          ("answer_stream", "chat_follow_up", "llm_alone", "chat_first"))
                console.print(f"warm-up done: retrieval p50 {statistics.median(retrieve):.1f} ms")
                for r in range(args.rounds):
                    for phase in orders[r % len(orders)]:
                        times[phase] += [phases[phase](i) for i in range(len(questions))]
                        console.print(f"round {r} {phase}: TTFT p50 so far {statistics.median(times[phase]):.1f} ms")
        finally:
            server.should_exit = True
            thread.join(30)
            quarry.close()
            if stub is not None:
                stub.stop()

    results: dict[str, Any] = {k: summary(v) for k, v in times.items()}
    results["retrieve_ms"] = summary(retrieve)
    results["rewrite_ms"] = summary(rewrite_ms)
    results["rewrite_methods"] = dict(methods)
    alone_p50 = results["llm_alone"]["p50"]
    added = results["chat_first"]["p50"] - alone_p50
    target = results["retrieve_ms"]["p50"] + 30
    results["added_ttft_ms_p50"] = {"value": added, "target": target, "met": added <= target,
                                    "ratio": results["chat_first"]["p50"] / alone_p50}
    follow = results["chat_follow_up"]["p50"] - alone_p50
    results["follow_up_added_ttft_ms_p50"] = {"value": follow, "ratio": results["chat_follow_up"]["p50"] / alone_p50}
    results["config"] = {"docs": len(docs), "queries": len(questions), "rounds": args.rounds,
                         "max_tokens": args.max_tokens, "context_tokens": args.context_tokens, "llm_url": args.llm_url,
                         "rewrite_timeout_s": args.rewrite_timeout_s}

    table = Table(title=f"chat completions, {len(questions)} SciFact questions x {args.rounds} rounds (TTFT, client)")
    for col in ("measure", "p50 ms", "p95 ms", "n"):
        table.add_column(col, justify="right" if col != "measure" else "left")
    for name in ("llm_alone", "answer_stream", "chat_first", "chat_follow_up", "retrieve_ms", "rewrite_ms"):
        s = results[name]
        table.add_row(name, f"{s['p50']:.1f}", f"{s['p95']:.1f}", str(s["n"]))
    console.print(table)
    console.print(f"first question: added TTFT p50 {added:.1f} ms (target <= retrieval p50 + 30 = {target:.1f} ms): "
                  f"{'met' if added <= target else 'NOT met'}; chat/alone p50 ratio "
                  f"{results['added_ttft_ms_p50']['ratio']:.3f}")
    ratio = results["follow_up_added_ttft_ms_p50"]["ratio"]
    console.print(f"follow-up: added TTFT p50 {follow:.1f} ms (ratio {ratio:.3f}); rewrites: {dict(methods)}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
