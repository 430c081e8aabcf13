"""A chat's conversation as one search query: a follow-up rewritten into a standalone question.

:func:`standalone_query` asks the answer's LLM (:func:`generation.rewrite.rewrite_messages`,
greedy, at most ``QUARRY_OPENAI__REWRITE_MAX_TOKENS`` tokens, within
``QUARRY_OPENAI__REWRITE_TIMEOUT_S``), checks its reply (:func:`generation.rewrite.check_rewrite`)
and otherwise rewrites by rules (:func:`generation.rewrite.rule_rewrite`): with no LLM, with the
LLM down, late or refusing, or with a reply that fails the check. A question with no earlier
user question is searched as it stands and costs no LLM call.

The conversation is the request's own (nothing is kept between requests), so a rewrite reads
only what the caller sent. The rewrite's tokens are spent from the caller's token quota like the
answer's (the prompt reserved before the LLM is asked, the completion charged after).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal

from generation.base import GenerationParams, Generator, Usage
from generation.rewrite import check_rewrite, rewrite_messages, rule_rewrite
from indexing.text import Language
from quarry.errors import GenerationError
from quarry.services.answer import TokenQuota
from quarry.settings import OpenAISettings

Method = Literal["none", "llm", "rules"]


@dataclass(frozen=True)
class Rewrite:
    """What is searched for a chat turn, and how it was made.

    Attributes:
        query: The query retrieval runs (the LLM's rewrite, the rules', or the question itself).
        original: The last user message, as sent.
        method: ``none`` (a first question, or rewriting off), ``llm`` or ``rules``.
        reason: Why not the LLM's rewrite (``llm: <error>``, ``llm: timeout``, ``llm_reply: <check>``,
            ``off``); ``None`` when the LLM's was used or no rewrite was needed.
        usage: The rewrite's LLM tokens (``None``: the LLM was not asked).
        ms: Milliseconds the rewrite took.
    """

    query: str
    original: str
    method: Method
    reason: str | None = None
    usage: Usage | None = None
    ms: float = 0.0

    @property
    def outcome(self) -> str:
        """A bounded label for :attr:`reason` (the metric's).

        ``ok``, ``timeout``, ``llm_error``, ``no_llm``, ``shed``, ``off``, or the check's reason
        (``dropped_follow_up``...).
        """
        reason = self.reason
        if reason is None:
            return "ok"
        if reason.startswith("llm_reply: "):
            return reason.removeprefix("llm_reply: ")
        known = {"llm: timeout": "timeout", "llm: no LLM is configured": "no_llm", "off": "off",
                 "llm: not asked (the server is saturated)": "shed"}
        return known.get(reason, "llm_error")

    def to_json(self) -> dict[str, Any]:
        """The ``quarry.rewrite`` extension of a chat completion."""
        usage = None if self.usage is None else {
            "prompt_tokens": self.usage.prompt_tokens or 0, "completion_tokens": self.usage.completion_tokens or 0,
        }
        return {"query": self.query, "original": self.original, "method": self.method, "reason": self.reason,
                "usage": usage, "ms": round(self.ms, 3)}


async def standalone_query(  # noqa: PLR0913 - the conversation and what the caller lends it
    generator: Generator | None,
    earlier: Sequence[str],
    question: str,
    *,
    settings: OpenAISettings,
    language: Language = "auto",
    quota: TokenQuota | None = None,
    enabled: bool = True,
    shed: bool = False,
) -> Rewrite:
    """The query to search for ``question`` asked after the user questions ``earlier`` (oldest first).

    Args:
        generator: The answer's LLM (``None``: rules only).
        earlier: The conversation's earlier user questions, oldest first (empty: a first question).
        question: The last user message.
        settings: The rewrite's bounds (turns read, tokens, deadline).
        language: The collection's analysis language (the check's and the rules' terms).
        quota: The caller's token quota (``None``: unlimited).
        enabled: ``False``: search ``question`` as it stands (``reason: "off"``).
        shed: The saturated server sheds this request: the rules only (an LLM call is not cheap).

    Raises:
        RateLimited: ``quota`` has no room for the rewrite's prompt (the LLM is not asked).
    """
    if not earlier:
        return Rewrite(question, question, "none")
    if not enabled:
        return Rewrite(question, question, "none", "off")
    started = time.perf_counter()
    recent = list(earlier[-settings.rewrite_turns:])
    if generator is None or shed:
        why = "llm: not asked (the server is saturated)" if shed else "llm: no LLM is configured"
        return _rules(recent, question, language, why, None, started)
    messages = rewrite_messages(recent, question)
    prompt_estimate = sum(generator.estimate_tokens(m["content"]) for m in messages)
    if quota is not None:
        quota.reserve(prompt_estimate)
    text, usage, failed = await _ask(generator, messages, settings)
    completion = usage.completion_tokens if usage and usage.completion_tokens is not None else (
        generator.estimate_tokens(text) if text else 0)
    usage = Usage(usage.prompt_tokens if usage and usage.prompt_tokens else prompt_estimate, completion)
    if quota is not None and completion:
        quota.charge(completion)
    if failed is not None:
        return _rules(recent, question, language, failed, usage, started)
    cleaned, refused = check_rewrite(text, question, recent, language)
    if refused is not None:
        return _rules(recent, question, language, f"llm_reply: {refused}", usage, started)
    return Rewrite(cleaned, question, "llm", None, usage, (time.perf_counter() - started) * 1000)


async def _ask(
    generator: Generator, messages: list[dict[str, str]], settings: OpenAISettings
) -> tuple[str, Usage | None, str | None]:
    """The LLM's reply (its first line is enough), its usage, and why it failed (``None``: it did not)."""
    params = GenerationParams(max_tokens=settings.rewrite_max_tokens, temperature=0.0)
    text, usage = "", None
    try:
        async with asyncio.timeout(settings.rewrite_timeout_s), aclosing(generator.stream(messages, params)) as pieces:
            async for piece in pieces:
                text += piece.text
                usage = piece.usage or usage
                if "\n" in text.strip():
                    break
    except TimeoutError:
        return text, usage, "llm: timeout"
    except GenerationError as exc:
        return text, usage, f"llm: {exc.message}"
    return text, usage, None


def _rules(  # noqa: PLR0913 - what the rewrite reports
    earlier: list[str], question: str, language: Language, reason: str, usage: Usage | None, started: float
) -> Rewrite:
    query = rule_rewrite(earlier[-1], question, language)
    return Rewrite(query, question, "rules", reason, usage, (time.perf_counter() - started) * 1000)
