"""The semantic cache's lexical-contradiction guard: two close questions that must not share an answer.

Sentence embeddings put a question and its negation, or the same question about another number
or another entity, within cosine 0.9-0.999 of each other (MiniLM: "Does vitamin D affect bone
density?" vs "Does vitamin D not affect bone density?" 0.991; "... 5 mg ..." vs "... 50 mg ..."
0.974). GPTCache's and RedisVL's default thresholds serve the cached answer to both. So a hit
also needs the two questions to agree on their words (:func:`contradiction`), checked in order:

* ``number``: the numbers (digits, and English number words up to twenty, ``hundred``...) as a
  multiset: "5 mg" vs "50 mg", "2 doses" vs "two doses" are equal only in the second case.
* ``negation``: the negations as a multiset: English ``not``/``no``/``never``/``without``/
  ``n't`` (contractions are expanded first)... and the Chinese negation characters 不 没 沒 无 無 非 未 别 勿 莫 否.
* ``content``: the sets of content terms (the collection's BM25 analysis: lower-cased,
  Snowball-stemmed, stopwords dropped, plus a list of question words and pronouns): "enable"
  vs "disable", "Python" vs "Java", "mg" vs "g" all differ. Named entities are approximated by
  these content terms (a capitalised word is a content term like any other).
* ``order``: the content terms in a different order ("does A cause B" vs "does B cause A").

A paraphrase that only changes function words ("How do I..." vs "How can I...", "the",
punctuation, case, plural or tense) passes; one that swaps a content word for a synonym does not
(a miss costs one LLM call; a false hit serves a wrong answer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from indexing.text import Language, tokenize

NEGATIONS = frozenset({
    "not", "no", "never", "without", "none", "nobody", "nothing", "neither", "nor", "nowhere", "cannot",
    "non", "except", "lack", "lacks", "lacking",
})
CJK_NEGATIONS = frozenset("不没沒无無非未别勿莫否")
NUMBER_WORDS = {
    w: str(i) for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty".split()
    )
} | {"thirty": "30", "forty": "40", "fifty": "50", "hundred": "100", "thousand": "1000", "million": "1e6",
     "billion": "1e9", "half": "0.5", "once": "1", "twice": "2", "double": "2", "triple": "3"}
QUESTION_WORDS = frozenset(
    "how what which who whom whose when where why whether do does did doing done can could would should "
    "shall may might must will i me my mine myself we us our ours you your yours he him his she her hers "
    "its they them their have has had having am is are was were be been being please tell explain "
    "know want need like get".split()
)
_WORDS = re.compile(r"[^\W_]+", re.UNICODE)
_CONTRACTIONS = (
    (re.compile(r"\bcan['’]t\b"), "can not"), (re.compile(r"\bwon['’]t\b"), "will not"),
    (re.compile(r"n['’]t\b"), " not"), (re.compile(r"['’](?:s|d|ll|ve|re|m)\b"), ""),
)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


@dataclass(frozen=True)
class Terms:
    """What the guard compares of one question (computed once per question).

    Attributes:
        numbers: Normalised numbers, sorted (``"5"``, ``"0.5"``, ``"1000"``).
        negations: Negation words and characters, sorted (``n't`` counts as ``not``).
        content: Content terms in order of first appearance, without numbers and negations.
    """

    numbers: tuple[str, ...]
    negations: tuple[str, ...]
    content: tuple[str, ...]


def terms(text: str, language: Language) -> Terms:
    """The guard's view of ``text``, analysed as the collection's ``language`` analyses it."""
    lowered = _uncontract(text.casefold())
    numbers = [_number(m.group()) for m in _NUMBER.finditer(lowered)]
    negations = [c for c in lowered if c in CJK_NEGATIONS]
    for word in _WORDS.findall(lowered):
        if word in NUMBER_WORDS:
            numbers.append(NUMBER_WORDS[word])
        if word in NEGATIONS:
            negations.append(word)
    skip = _skipped(language)
    content: dict[str, None] = {}
    for term in tokenize(lowered, language):
        if term.startswith("#") or term in skip or _NUMBER.fullmatch(term) or term in CJK_NEGATIONS:
            continue  # '#' terms are BM25's CJK bigrams; jieba's words stand for the text
        content.setdefault(term, None)
    return Terms(tuple(sorted(numbers)), tuple(sorted(negations)), tuple(content))


def contradiction(a: Terms, b: Terms) -> str | None:
    """Why two questions must not share an answer, or ``None`` when their words agree.

    Returns:
        ``"number"``, ``"negation"``, ``"content"`` or ``"order"`` (see the module docstring).
    """
    if a.numbers != b.numbers:
        return "number"
    if a.negations != b.negations:
        return "negation"
    if set(a.content) != set(b.content):
        return "content"
    if a.content != b.content:
        return "order"
    return None


def _uncontract(text: str) -> str:
    """``"doesn't"`` -> ``"does not"``, ``"can't"`` -> ``"can not"``, ``"it's"`` -> ``"it"``."""
    for pattern, replacement in _CONTRACTIONS:
        text = pattern.sub(replacement, text)
    return text


def _number(raw: str) -> str:
    """``"1,000"`` -> ``"1000"``, ``"5.0"`` -> ``"5"``; a decimal comma (``"2,5"``) stays apart from 25."""
    if re.fullmatch(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?", raw):
        raw = raw.replace(",", "")
    try:
        value = float(raw.replace(",", "."))
    except ValueError:
        return raw
    return f"{value:g}" if value < 1e15 else raw


@lru_cache(maxsize=4)
def _skipped(language: Language) -> frozenset[str]:
    """Question words, negations and number words as ``language``'s analysis spells them."""
    words = (*QUESTION_WORDS, *NEGATIONS, *NUMBER_WORDS)
    return frozenset(t for w in words for t in (tokenize(w, language) or [w]))

