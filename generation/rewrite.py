"""A chat's follow-up as a standalone search query: the LLM's prompt, a rule-based rewrite, a junk check.

A follow-up such as "and in children?" after "Does vitamin D deficiency increase the risk of
cancer?" retrieves nothing useful as it stands. The answer path asks the LLM to rewrite it
(:func:`rewrite_messages`: a system rule and two worked examples, the earlier questions and the
last one), checks the reply (:func:`check_rewrite`: small models often repeat the earlier
question or drop the follow-up's own words) and falls back on :func:`rule_rewrite` when the LLM
is down, late or its reply fails the check.

:func:`rule_rewrite`: a follow-up that starts with a connective ("and", "what about", "how
about", "but", "also", Chinese 那/那么/还有 or a final 呢) is appended to the previous question
("Does vitamin D deficiency increase the risk of cancer in children?"); one that leans on a
pronoun ("does it ...", "those") or has fewer than :data:`MIN_OWN_TERMS` content terms is joined
to the previous question; any other is already standalone and kept as it is.

Content terms are the BM25 analysis of :func:`indexing.text.tokenize` (lower-cased, stemmed,
stopwords dropped), less :data:`FUNCTION_WORDS` (question words, pronouns, connectives).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from generation.base import Message
from indexing.text import Language, tokenize

SYSTEM = (
    "Rewrite the user's last question as one standalone search query, using the earlier questions "
    "for what it refers to. Reply with the query only."
)
EXAMPLES = (
    ("Is aspirin effective against heart attacks?", "what about strokes?", "Is aspirin effective against strokes?"),
    ("What causes type 2 diabetes?", "how is it treated?", "How is type 2 diabetes treated?"),
)
"""(earlier question, follow-up, standalone query): the prompt's worked examples."""

CONNECTIVES = (
    "and what about", "and how about", "what about", "how about", "what of", "same for", "same question for",
    "and", "but", "also", "or", "then", "so",
)
"""English openings that make a question a follow-up (longest first)."""
CJK_CONNECTIVES = ("那么", "还有", "那")
PRONOUNS = frozenset(
    "it its itself they them their theirs this that these those he him his she her there such one ones".split()
)
FUNCTION_WORDS = PRONOUNS | frozenset(
    "how what which who whom whose when where why whether do does did can could would should may might must "
    "will is are was were be been being about and but also or then so same question tell me please "
    "i we you my our your".split()
)
MIN_OWN_TERMS = 3
"""A follow-up with fewer content terms than this leans on the conversation."""
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_LABEL = re.compile(r"^\s*(?:standalone\s+)?(?:search\s+)?(?:query|question|rewritten(?: query)?)\s*:\s*", re.I)


def rewrite_messages(earlier: Sequence[str], followup: str) -> list[Message]:
    """The LLM's prompt: the rule, two worked examples, then the earlier questions and the follow-up.

    Args:
        earlier: The conversation's earlier user questions, oldest first (the caller bounds them).
        followup: The last user question.
    """
    messages: list[Message] = [{"role": "system", "content": SYSTEM}]
    for before, after, standalone in EXAMPLES:
        messages.append({"role": "user", "content": f"Earlier question: {before}\nLast question: {after}"})
        messages.append({"role": "assistant", "content": standalone})
    asked = "\n".join(f"Earlier question: {q}" for q in earlier)
    messages.append({"role": "user", "content": f"{asked}\nLast question: {followup}"})
    return messages


def needs_context(followup: str, language: Language = "auto") -> bool:
    """Whether ``followup`` leans on the conversation (a connective, a pronoun, or too few content terms)."""
    text = followup.strip()
    words = [w.casefold() for w in _WORD.findall(text)]
    if _connective(text) is not None or any(w in PRONOUNS for w in words):
        return True
    return len(content_terms(text, language)) < MIN_OWN_TERMS


def rule_rewrite(previous: str, followup: str, language: Language = "auto") -> str:
    """The follow-up made standalone without an LLM (see the module docstring); ``followup`` if it is already."""
    text = followup.strip()
    base = previous.strip().rstrip("?？!！.。 ")
    if not base:
        return text
    rest = _connective(text)
    if rest is not None:
        tail = rest.strip(" ,，")
        if tail.rstrip("?？!！.。 "):
            end = "" if tail[-1:] in "?？!！.。" else "?"
            return f"{base} {tail}{end}"
        return f"{base}?"
    if needs_context(text, language):
        return f"{base}: {text}"
    return text


def check_rewrite(candidate: str, followup: str, earlier: Sequence[str], language: Language = "auto",
                  max_chars: int = 500) -> tuple[str, str | None]:
    """The LLM's rewrite cleaned (first line, no label or quotes), and why it is refused (``None``: kept).

    Refusal reasons: ``empty``; ``too_long`` (over ``max_chars``); ``dropped_follow_up`` (fewer
    than half of the follow-up's content terms are in it); ``repeats_earlier`` (its content terms
    are an earlier question's, the follow-up's own left out); ``no_context`` (the follow-up leans
    on the conversation but the rewrite holds no term of the earlier questions).
    """
    lines = [ln for ln in candidate.strip().splitlines() if ln.strip()]
    text = _LABEL.sub("", lines[0]).strip().strip("\"'“”‘’`").strip() if lines else ""
    if not text:
        return text, "empty"
    if len(text) > max_chars:
        return text, "too_long"
    got = set(content_terms(text, language))
    own = set(content_terms(followup, language))
    if own and len(own & got) * 2 < len(own):
        return text, "dropped_follow_up"
    before = [set(content_terms(q, language)) for q in earlier]
    if any(got == b for b in before) and not own <= got:
        return text, "repeats_earlier"
    if needs_context(followup, language) and not got & set().union(*before):
        return text, "no_context"
    return text, None


def content_terms(text: str, language: Language = "auto") -> list[str]:
    """``text``'s content terms: its BM25 terms less question words, pronouns and connectives."""
    skip = _skipped(language)
    return [t for t in tokenize(text.casefold(), language) if not t.startswith("#") and t not in skip]


def _connective(text: str) -> str | None:
    """What follows a follow-up's opening connective, or ``None`` when it opens with none."""
    lowered = text.casefold()
    for opening in CONNECTIVES:
        if lowered == opening or re.match(rf"{re.escape(opening)}\b", lowered):
            return text[len(opening):]
    stripped = text.rstrip("?？ ")
    ends = stripped.endswith("呢")
    if ends:
        stripped = stripped[:-1]
    for opening in CJK_CONNECTIVES:
        if stripped.startswith(opening):
            return stripped[len(opening):]
    return stripped if ends else None


@lru_cache(maxsize=4)
def _skipped(language: Language) -> frozenset[str]:
    """:data:`FUNCTION_WORDS` as ``language``'s analysis spells them."""
    return frozenset(t for w in FUNCTION_WORDS for t in (tokenize(w, language) or [w]))
