"""Whether a cited chunk backs the sentence that cites it: lexical coverage, then contradiction rules.

A sentence copied or closely paraphrased from its chunk is supported; one whose numbers,
negation or named entities differ from the chunk's is not, however many words the two share.
:func:`check` decides in this order (the first rule that fails is the ``reason``):

0. ``question``: the sentence is not a question (a small model may echo the user's).
1. ``coverage``: the share of the sentence's content terms (BM25's analysis of the collection's
   language: lower-cased, stop words dropped, Snowball-stemmed; jieba words for Chinese) found in
   the chunk (its title included) is at least the threshold (``QUARRY_LLM__SUPPORT_THRESHOLD``, 0.5).
2. ``number``: every number of the sentence (digits, decimals, ``1,000``, percentages; English
   number words up to twenty; Chinese numerals) occurs in the chunk.
3. ``negation``: the sentence and its quote (the chunk's sentence closest to it) are both
   negated or both not (``not``, ``no``, ``never``, ``n't``, ``without``, ``fail to``...; 不 没 无 未 非...).
4. ``antonym``: the sentence does not use a word whose opposite (``increase``/``decrease``,
   ``higher``/``lower``, 增加/减少 ...) is in the quote while the word itself is not.
5. ``entity``: every named term of the sentence (a capitalised word not opening it, an acronym, a
   word with a digit; Chinese person, place and organisation names by jieba's tagger) occurs in
   the chunk.

Pure functions, no model: the same check for the streaming and the non-streaming answer, and in
the hand-written cases of ``tests/generation/test_support.py`` (precision and recall >= 0.9).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from generation.cache_guard import number_form
from indexing.text import Language, tokenize

NEGATIONS = frozenset({
    "not", "no", "never", "without", "none", "nobody", "nothing", "neither", "nor", "cannot", "fail", "fails",
    "failed", "absent", "absence",
})
CJK_NEGATIONS = frozenset("不没沒无無非未否")
CJK_NEGATION_WORDS = ("不断", "无论", "非常", "并非常", "无数", "未来", "毫无疑问")  # not negations
NUMBER_WORDS = {
    w: str(i) for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty".split()
    )
} | {"thirty": "30", "forty": "40", "fifty": "50", "hundred": "100", "thousand": "1000", "million": "1e+06",
     "twice": "2", "double": "2", "half": "0.5"}
CJK_DIGITS = {
    "零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9,
}
CJK_UNITS = {"十": 10, "百": 100, "千": 1000, "万": 10_000, "亿": 100_000_000}
ANTONYMS = (
    ("increase", "decrease"), ("increase", "reduce"), ("increase", "lower"), ("higher", "lower"),
    ("more", "less"), ("more", "fewer"), ("rise", "fall"), ("gain", "loss"), ("enable", "disable"),
    ("before", "after"), ("larger", "smaller"), ("maximum", "minimum"), ("positive", "negative"),
    ("inhibit", "promote"), ("inhibit", "activate"), ("upregulate", "downregulate"), ("benefit", "harm"),
    ("improve", "worsen"), ("accept", "reject"), ("allow", "forbid"), ("always", "rarely"),
    ("增加", "减少"), ("提高", "降低"), ("升高", "降低"), ("上升", "下降"), ("增强", "减弱"), ("促进", "抑制"),
    ("高于", "低于"), ("上调", "下调"), ("多于", "少于"), ("开启", "关闭"), ("允许", "禁止"), ("之前", "之后"),
    ("最大", "最小"),
)
_WORDS = re.compile(r"[^\W_]+", re.UNICODE)
_NUMBER = re.compile(r"(?<![0-9A-Za-z.])\d+(?:[.,]\d+)*")
_CJK_NUMBER = re.compile("[零〇一二两三四五六七八九十百千万亿]+")
_CONTRACTION = re.compile(r"n['’]t\b")
SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|(?<=[。！？；])\s*|\n+")
"""Where a text is split into sentences (an ASCII stop needs a space after it: ``0.25`` is one number)."""
_NAMED = re.compile(r"(?<!^)(?<![.!?]\s)\b(?:[A-Z][\w-]*[A-Z0-9][\w-]*|[A-Z][a-z][\w-]*|[a-z]+\d[\w-]*)\b")
_CJK = re.compile("[\u4e00-\u9fff]")


@dataclass(frozen=True)
class Support:
    """The check's verdict on one (sentence, chunk) pair.

    Attributes:
        score: Share of the sentence's content terms found in the chunk (0..1).
        quote: The chunk's sentence sharing most content terms with the cited one ("" when none does).
        supported: Every rule passed.
        reason: The first rule that failed (``coverage``, ``number``, ``negation``, ``antonym``,
            ``entity``), ``None`` when supported.
    """

    score: float
    quote: str
    supported: bool
    reason: str | None


def check(claim: str, chunk: str, language: Language, threshold: float = 0.5) -> Support:
    """Whether ``chunk`` backs ``claim`` (see the module docstring for the rules, in order)."""
    terms = set(tokenize(claim, language))
    if not terms:
        return Support(0.0, "", False, "coverage")
    chunk_terms = set(tokenize(chunk, language))
    score = len(terms & chunk_terms) / len(terms)
    quote = _quote(claim, terms, chunk, language)
    reason: str | None = None
    if claim.rstrip().endswith(("?", "？")):
        reason = "question"  # a question asks; it claims nothing (a model may echo the user's)
    elif score < threshold:
        reason = "coverage"
    elif not numbers(claim) <= numbers(chunk):
        reason = "number"
    elif negated(claim) != negated(quote):
        reason = "negation"
    elif _antonym(claim, quote, language):
        reason = "antonym"
    elif not _entities_in(claim, chunk, language):
        reason = "entity"
    return Support(score, quote, reason is None, reason)


def numbers(text: str) -> set[str]:
    """The numbers of ``text``, normalised (``"1,000"`` and ``"1000"`` -> ``"1000"``; ``"五"`` -> ``"5"``)."""
    out = {number_form(m.group()) for m in _NUMBER.finditer(text)}
    for word in _WORDS.findall(text.casefold()):
        if word in NUMBER_WORDS:
            out.add(NUMBER_WORDS[word])
    for m in _CJK_NUMBER.finditer(text):
        value = _cjk_value(m.group())
        if not any(c in CJK_DIGITS or c == "十" for c in m.group()):
            continue  # a lone 百, 千, 万 is a word (百分, 千克, 万一), not a number
        if value is not None and (value != 1 or len(m.group()) > 1 or _cjk_counted(text, m.end())):
            out.add(number_form(str(value)))
    return out


def negated(text: str) -> bool:
    """Whether ``text`` holds an odd number of negations (a double negation is none)."""
    lowered = _CONTRACTION.sub(" not", text.casefold())
    count = sum(1 for w in _WORDS.findall(lowered) if w in NEGATIONS)
    cleaned = lowered
    for word in CJK_NEGATION_WORDS:
        cleaned = cleaned.replace(word, "")
    count += sum(1 for c in cleaned if c in CJK_NEGATIONS)
    return count % 2 == 1


def _quote(claim: str, terms: set[str], chunk: str, language: Language) -> str:
    """The chunk sentence with most of ``terms`` (ties: the earlier one)."""
    best, best_overlap = "", 0
    for sentence in SENTENCE_END.split(chunk):
        overlap = len(terms & set(tokenize(sentence, language)))
        if overlap > best_overlap:
            best, best_overlap = sentence.strip(), overlap
    return best


def _antonym(claim: str, quote: str, language: Language) -> bool:
    """The claim says a word whose opposite the quote says instead."""
    a, b = _stems(claim, language), _stems(quote, language)
    for left, right in _antonym_stems(language):
        if (left in a and left not in b and right in b) or (right in a and right not in b and left in b):
            return True
    return False


def _entities_in(claim: str, chunk: str, language: Language) -> bool:
    """Every named term of ``claim`` occurs in ``chunk``."""
    folded = chunk.casefold()
    claim = claim.strip()
    for name in _NAMED.findall(claim):
        if name.casefold() not in folded:
            return False
    first = _WORDS.match(claim)  # an opening word is capitalised anyway: a name only if the chunk lacks it
    if first and first.group()[:1].isupper() and tokenize(first.group(), language):
        if first.group().casefold() not in folded:
            return False
    if _CJK.search(claim):
        for word in _cjk_names(claim):
            if word not in chunk:
                return False
    return True


def _cjk_names(text: str) -> list[str]:
    """Person, place, organisation and other proper names of Chinese ``text`` (jieba's tagger)."""
    import jieba.posseg

    return [w.word for w in jieba.posseg.cut(text) if w.flag in ("nr", "ns", "nt", "nz", "nrt") and len(w.word) > 1]


def _stems(text: str, language: Language) -> set[str]:
    return set(tokenize(_CONTRACTION.sub(" not", text), language)) | set(_WORDS.findall(text))


@lru_cache(maxsize=8)
def _antonym_stems(language: Language) -> tuple[tuple[str, str], ...]:
    pairs = []
    for left, right in ANTONYMS:
        a, b = tokenize(left, language) or [left], tokenize(right, language) or [right]
        pairs.append((a[0], b[0]))
    return tuple(pairs)


def _cjk_value(word: str) -> int | None:
    """``"三十五"`` -> 35, ``"两千"`` -> 2000, ``"二〇二四"`` -> 2024; ``None`` when not a numeral."""
    if all(c in CJK_DIGITS for c in word):
        return int("".join(str(CJK_DIGITS[c]) for c in word))
    total, section, digit = 0, 0, 0
    for c in word:
        if c in CJK_DIGITS:
            digit = CJK_DIGITS[c]
        elif c in ("万", "亿"):
            section = (section + digit) * CJK_UNITS[c]
            total, section, digit = total + section, 0, 0
        else:
            section += (digit or 1) * CJK_UNITS[c]
            digit = 0
    return total + section + digit


def _cjk_counted(text: str, end: int) -> bool:
    """A lone 一 counts as the number one only before a measure word (一个, 一次), not in 一样 or 统一."""
    return end < len(text) and text[end] in "个次种名位天年月周倍项份只条件台"
