"""The answer prompt: numbered sources within a context budget in tokens, then the question.

Chunks go in whole, in rank order, while they fit the budget; the first that does not fit is cut
(at a word boundary, when at least :data:`MIN_CUT_TOKENS` of the budget remain) and the rest are
left out. The count is the LLM's own tokenizer where the server exposes one
(:meth:`generation.base.Generator.count_tokens`), else its stated approximation; the joined
sources block is counted once more at the end and the last chunk trimmed until the block fits,
so what the model reads stays within the budget.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from generation.base import Message

MIN_CUT_TOKENS = 16
SEPARATOR = "\n\n"
SYSTEM = (
    "Answer the question in one or two sentences using only the numbered sources. End every sentence "
    'with the number of the source it comes from in square brackets, for example: "Vitamin C prevents '
    'scurvy [2]." If the sources do not contain the answer, say that you do not know.'
)

Counter = Callable[[Sequence[str]], Awaitable[list[int]]]


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
    """A chunk placed in the prompt as source ``number``; ``text`` is what was sent (maybe cut)."""

    number: int
    candidate: Candidate
    text: str
    tokens: int
    status: Literal["sent", "cut"]


@dataclass
class Prompt:
    """The messages for the LLM and what the sources block holds."""

    messages: list[Message]
    sent: list[Sent]
    left_out: list[Candidate]
    context: str
    context_tokens: int
    budget: int
    tokenizer: str
    notes: list[str] = field(default_factory=list)


def source_text(number: int, text: str) -> str:
    """How source ``number`` appears in the prompt."""
    return f"[{number}] {text}"


def messages_for(query: str, context: str) -> list[Message]:
    """The chat messages: instructions, then the sources block and the question."""
    if not context:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Question: {query}"}]
    user = f"Sources:\n\n{context}\n\nQuestion: {query}\nAnswer, citing sources like [1]:"
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


async def build_prompt(
    query: str, candidates: Sequence[Candidate], budget: int, count: Counter, tokenizer: str
) -> Prompt:
    """Fit ``candidates`` into ``budget`` tokens of sources and build the messages.

    Args:
        query: The question.
        candidates: Retrieved chunks, best first.
        budget: Tokens the sources block may take.
        count: Tokens of each of several texts (the LLM's tokenizer, or an estimate).
        tokenizer: ``"server"`` or ``"approx"``: what ``count`` is, reported with the prompt.

    Raises:
        GenerationUnavailable: ``count`` could not ask the server.
    """
    parts = [source_text(i + 1, c.text) for i, c in enumerate(candidates)]
    counts = await count(parts) if parts else []
    sep = (await count([SEPARATOR]))[0] if len(parts) > 1 else 0
    sent: list[Sent] = []
    used = 0
    for i, (cand, n) in enumerate(zip(candidates, counts, strict=True)):
        cost = n + (sep if sent else 0)
        if used + cost <= budget:
            sent.append(Sent(i + 1, cand, cand.text, n, "sent"))
            used += cost
            continue
        room = budget - used - (sep if sent else 0)
        if room >= MIN_CUT_TOKENS:
            cut = await _cut(i + 1, cand.text, n, room, count)
            if cut is not None:
                sent.append(Sent(i + 1, cand, cut[0], cut[1], "cut"))
        break
    context, tokens = await _fit(sent, budget, count)
    left_out = list(candidates[len(sent) :])
    return Prompt(messages_for(query, context), sent, left_out, context, tokens, budget, tokenizer)


async def _cut(number: int, text: str, tokens: int, room: int, count: Counter) -> tuple[str, int] | None:
    """The longest word-boundary prefix of ``text`` whose source line fits ``room`` tokens (few counts)."""
    words = text.split(" ")
    keep = int(len(words) * room / max(tokens, 1))
    for _ in range(8):
        if keep <= 0:
            return None
        cut = " ".join(words[:keep]).rstrip() + " …"
        n = (await count([source_text(number, cut)]))[0]
        if n <= room:
            return cut, n
        keep = min(keep - 1, int(keep * room / n * 0.97))
    return None


async def _fit(sent: list[Sent], budget: int, count: Counter) -> tuple[str, int]:
    """Join the sources and count the block; trim (or drop) the last one until it fits ``budget``."""
    while sent:
        context = SEPARATOR.join(source_text(s.number, s.text) for s in sent)
        total = (await count([context]))[0]
        if total <= budget:
            return context, total
        last = sent.pop()
        room = last.tokens - (total - budget)
        if room >= MIN_CUT_TOKENS:
            cut = await _cut(last.number, last.text.removesuffix(" …"), last.tokens, room, count)
            if cut is not None:
                sent.append(Sent(last.number, last.candidate, cut[0], cut[1], "cut"))
    return "", 0
