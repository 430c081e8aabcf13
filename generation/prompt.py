"""The answer prompt: numbered sources within a context budget in tokens, then the question.

Chunks go in whole, in rank order, while they fit the budget; the first that does not fit is cut
(at a word boundary, when at least :data:`MIN_CUT_TOKENS` of the budget remain) and the rest are
left out. The choice is made with a local estimate (no round trip: the generator's calibrated
characters-per-token, else :func:`approx_tokens`); then the joined sources block is counted once
with the exact counter (the LLM's own tokenizer where the server exposes one,
:meth:`generation.base.Generator.count_tokens`) and, only when the estimate fell short, the last
chunk is trimmed and the block recounted until it fits. So what the model reads stays within
the budget, and a request costs one tokenizer round trip in the usual case (counting
each chunk, the separator and every cut on the server cost 5-10 round trips before the first
token, +1.1 s on a 1-thread llama.cpp server).
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from generation.base import Message

MIN_CUT_TOKENS = 16
MAX_RECOUNTS = 4  # exact recounts after the first, when the estimate fell short; then the last chunk goes
SEPARATOR = "\n\n"
CHARS_PER_TOKEN = 3.0
SYSTEM = (
    "Answer the question in one or two sentences using only the numbered sources. End every sentence "
    'with the number of the source it comes from in square brackets, for example: "Vitamin C prevents '
    'scurvy [2]." If the sources do not contain the answer, say that you do not know.'
)
_CJK = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]")

Counter = Callable[[Sequence[str]], Awaitable[list[int]]]
Estimate = Callable[[str], int]


def approx_tokens(text: str, chars_per_token: float = CHARS_PER_TOKEN) -> int:
    """Estimated tokens of ``text`` when the model's tokenizer is unknown.

    One token per CJK/kana/hangul character, one per ``chars_per_token`` other characters
    (English BPE vocabularies average about 4 characters a token, so the default 3 errs on the
    side of the budget).
    """
    cjk = len(_CJK.findall(text))
    return cjk + math.ceil((len(text) - cjk) / chars_per_token)


@dataclass(frozen=True)
class Candidate:
    """A retrieved chunk offered to the prompt, in rank order."""

    document_id: str
    chunk_id: str
    text: str
    score: float
    title: str | None = None


@dataclass(frozen=True)
class Sent:
    """A chunk placed in the prompt as source ``number``; ``text`` is what was sent (maybe cut).

    ``tokens`` is the local estimate of its source line (the block's exact count is the prompt's).
    """

    number: int
    candidate: Candidate
    text: str
    tokens: int
    status: Literal["sent", "cut"]


@dataclass
class Prompt:
    """The messages for the LLM and what the sources block holds (``context_tokens``: exact count)."""

    messages: list[Message]
    sent: list[Sent]
    left_out: list[Candidate]
    context: str
    context_tokens: int
    budget: int
    tokenizer: str
    notes: list[str] = field(default_factory=list)
    counts: int = 0  # calls of the exact counter (tokenizer round trips when it is the server's)


def source_text(number: int, text: str) -> str:
    """How source ``number`` appears in the prompt."""
    return f"[{number}] {text}"


def messages_for(query: str, context: str, system: str = SYSTEM) -> list[Message]:
    """The chat messages: instructions (``system``), then the sources block and the question."""
    if not context:
        return [{"role": "system", "content": system}, {"role": "user", "content": f"Question: {query}"}]
    ask = "Answer, citing sources like [1]:" if system == SYSTEM else "Answer in JSON:"
    user = f"Sources:\n\n{context}\n\nQuestion: {query}\n{ask}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


async def build_prompt(
    query: str,
    candidates: Sequence[Candidate],
    budget: int,
    count: Counter,
    tokenizer: str,
    estimate: Estimate = approx_tokens,
    system: str = SYSTEM,
) -> Prompt:
    """Fit ``candidates`` into ``budget`` tokens of sources and build the messages.

    Args:
        query: The question.
        candidates: Retrieved chunks, best first.
        budget: Tokens the sources block may take.
        count: Exact tokens of each of several texts (the LLM's tokenizer, or the approximation);
            called once on the joined block, again only when ``estimate`` fell short.
        tokenizer: ``"server"`` or ``"approx"``: what ``count`` is, reported with the prompt.
        estimate: Local tokens of one text, used to choose and cut chunks (no I/O).
        system: The instructions (:data:`SYSTEM`: free text with ``[n]`` markers;
            :data:`generation.structured.SYSTEM`: a JSON answer).

    Raises:
        GenerationUnavailable: ``count`` could not ask the server.
    """
    sent = _select(candidates, budget, estimate)
    context, tokens, calls = await _fit(sent, budget, count, estimate)
    left_out = list(candidates[len(sent) :])
    prompt = Prompt(messages_for(query, context, system), sent, left_out, context, tokens, budget, tokenizer)
    prompt.counts = calls
    return prompt


def _select(candidates: Sequence[Candidate], budget: int, estimate: Estimate) -> list[Sent]:
    """Whole chunks while they fit by the estimate, then one cut; the rest are left out."""
    sep = estimate(SEPARATOR) if len(candidates) > 1 else 0
    sent: list[Sent] = []
    used = 0
    for i, cand in enumerate(candidates):
        n = estimate(source_text(i + 1, cand.text))
        cost = n + (sep if sent else 0)
        if used + cost <= budget:
            sent.append(Sent(i + 1, cand, cand.text, n, "sent"))
            used += cost
            continue
        room = budget - used - (sep if sent else 0)
        if room >= MIN_CUT_TOKENS:
            cut = _cut(i + 1, cand.text, n, room, estimate)
            if cut is not None:
                sent.append(Sent(i + 1, cand, cut[0], cut[1], "cut"))
        break
    return sent


def _cut(number: int, text: str, tokens: int, room: int, estimate: Estimate) -> tuple[str, int] | None:
    """The longest word-boundary prefix of ``text`` whose source line fits ``room`` estimated tokens."""
    words = text.split(" ")
    keep = int(len(words) * room / max(tokens, 1))
    for _ in range(16):
        if keep <= 0:
            return None
        cut = " ".join(words[:keep]).rstrip() + " …"
        n = estimate(source_text(number, cut))
        if n <= room:
            return cut, n
        keep = min(keep - 1, int(keep * room / n * 0.97))
    return None


async def _fit(sent: list[Sent], budget: int, count: Counter, estimate: Estimate) -> tuple[str, int, int]:
    """Join the sources and count the block exactly; trim (or drop) the last one until it fits.

    Returns:
        The block, its exact tokens, and how many times ``count`` was called.
    """
    calls = 0
    while sent:
        context = SEPARATOR.join(source_text(s.number, s.text) for s in sent)
        total = (await count([context]))[0]
        calls += 1
        if total <= budget:
            return context, total, calls
        last = sent.pop()
        # the estimate fell short (it counted fewer tokens than there are), so shrinking the last
        # chunk by ``over`` estimated tokens, plus a margin, removes at least ``over`` real ones
        room = last.tokens - math.ceil((total - budget) * 1.1) - 2
        if room >= MIN_CUT_TOKENS and calls <= MAX_RECOUNTS:
            cut = _cut(last.number, last.text.removesuffix(" …"), last.tokens, room, estimate)
            if cut is not None:
                sent.append(Sent(last.number, last.candidate, cut[0], cut[1], "cut"))
    return "", 0, calls
