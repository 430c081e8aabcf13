"""The semantic answer cache's lexical-contradiction guard: two close questions that must not share an answer.

Sentence embeddings put a question and its negation, or the same question about another number,
unit or entity, within cosine 0.9-0.999 of each other (all-MiniLM-L6-v2: "Does vitamin D affect
bone density?" vs "Does vitamin D not affect bone density?" 0.987; "... 5 mg ..." vs "... 50 mg
..." 0.944; "如何开启深色模式" vs "如何关闭深色模式" 0.990). GPTCache's and RedisVL's default
thresholds serve the cached answer to both. So a hit also needs the two questions not to
contradict each other in their words (:func:`contradiction`), checked in this order:

* ``number``: the numbers (digits, and English number words up to twenty, ``hundred``...) as a
  multiset: "5 mg" vs "50 mg" differ, "2 doses" vs "two doses" agree.
* ``negation``: the negations as a multiset: English ``not``/``no``/``never``/``without``/
  ``n't`` (contractions are expanded first)... and the Chinese negation characters 不 没 沒 无 無
  非 未 别 勿 莫 否. Privative words (``lack``, ``deficiency``, ``deprivation``, ``absence``,
  缺乏, 缺少...) count as one class of their own, so "a lack of vitamin D" and "vitamin D
  deficiency" agree while "a lack of exercise" and "exercise" do not.
* ``antonym``: one question holds a word of one pole of :data:`POLES` that the other lacks, and
  the other a word of the opposite pole ("enable" / "turn off", "increase" / "lower", "kids" /
  "adults", 开启 / 关闭, 增加 / 降低); or a content term is another's with a negating prefix
  ("safe" / "unsafe", "available" / "unavailable"). Words of the same pole are synonyms here:
  "lower" / "reduce", "above" / "over", "turn on" / "enable" pass.
* ``unit``: a differing content term is a unit (:data:`UNITS`: "mg" / "g", "km" / "miles",
  "seconds" / "minutes", 毫克 / 克).
* ``date``: a differing term is a date word (months, weekdays, "yesterday", "next", 昨天...).
* ``entity``: a differing term is written as a name: capitalised inside the question, all
  capitals, a letter with digits, a single letter ("vitamin D" / "vitamin K", "Ubuntu" /
  "Fedora"), or a place, person or organisation name to jieba's tagger (北京 / 上海).
* ``order``: the same content terms in another order, when the question has a direction word
  ("from", "to", "cause", "than", 从, 到, 导致...): "migrate from Milvus to Qdrant" vs "from
  Qdrant to Milvus", "does smoking cause cancer" vs "does cancer cause smoking".

Any other difference of content words ("kids" / "children", "shipping" / "delivery", 吸烟 /
抽烟) is left to the cosine threshold: a paraphrase that swaps a word for a synonym hits; but only
when the query encoder declares the question's language (its :class:`~embedding.card.ModelCard`).
Otherwise its cosine says nothing (all-MiniLM-L6-v2, English only, puts "为什么测试失败了？" and
"怎么关闭通知？" at 0.964) and the rule ``content`` asks for the same content terms. The
rules were calibrated on the labelled pairs of ``eval/data/cache_pairs_dev.jsonl`` (the test
half, ``cache_pairs_test.jsonl``, was not looked at while tuning); ``bench/cache.py`` reports both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import jieba.posseg

from indexing.text import Language, tokenize

NEGATIONS = frozenset({
    "not", "no", "never", "without", "none", "nobody", "nothing", "neither", "nor", "nowhere", "cannot",
    "non", "except",
})
PRIVATIVES = frozenset({
    "lack", "lacks", "lacking", "deficiency", "deficient", "deficiencies", "deprivation", "deprived",
    "absence", "absent", "shortage", "insufficient", "insufficiency", "inadequate",
    "缺乏", "缺少", "缺失", "不足", "匮乏", "短缺",
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
POLES: tuple[tuple[str, str], ...] = (
    # (one pole, the other): words of a pole are synonyms to the guard, the two poles opposites
    ("enable enabled activate activated on 开启 打开 启用 激活 开通",
     "disable disabled deactivate deactivated off 关闭 禁用 停用 关掉"),
    ("start starts started begin launch open 开始 启动", "stop stops stopped end halt quit close shut 停止 结束"),
    ("allow allowed permit accept grant whitelist 允许 接受", "block blocked deny reject forbid ban revoke blacklist "
     "禁止 阻止 拒绝"),
    ("increase increases increased raise raises rise higher high more above over up exceed maximum max most "
     "largest larger bigger greater upper boost promote promotes enhance enhances induce induces stimulate "
     "stimulates activate activates upregulate upregulates improve improves accelerate accelerates worsen "
     "增加 提高 升高 上升 上涨 增长 增大 增多 加大 更多 最大 高于 超过 促进 增强 激活 加速 改善",
     "decrease decreases decreased reduce reduces reduced lower low less below under down fall drop cut "
     "minimum min least smallest smaller fewer decline suppress suppresses inhibit inhibits impair impairs "
     "downregulate downregulates attenuate attenuates prevent prevents slow slows block blocks "
     "减少 降低 下降 下跌 减小 缩小 更少 最小 低于 抑制 减弱 阻止 减缓 损害"),
    ("add added insert create install attach 添加 创建 安装", "remove removed delete deleted uninstall detach "
     "erase destroy 删除 卸载 移除"),
    ("upload uploads import 上传 导入", "download downloads export 下载 导出"),
    ("buy purchase 购买 买入", "sell 出售 卖出"),
    ("succeed succeeds success successful pass passes passed 成功 通过", "fail fails failed failure 失败"),
    ("safe healthy beneficial benefit effective 安全 有益 有效", "dangerous unsafe harmful toxic risky 危险 有害"),
    ("good better best favorable favourable improved superior 好 更好 良好 有利", "bad poor poorer worse worst "
     "unfavorable unfavourable adverse inferior 差 更差 不良 不利"),
    ("adult adults grown 成人 大人 成年人", "child children kid kids infant infants baby babies toddler teen "
     "teenager 儿童 小孩 孩子 婴儿 幼儿 小孩子"),
    ("male men man boy boys 男性 男人 男孩", "female women woman girl girls 女性 女人 女孩"),
    ("before earlier prior 之前 以前", "after later 之后 以后"),
    ("in login signin 登录", "out logout signout 登出 退出"),
    ("old older oldest legacy 旧", "new newer newest latest 新"),
    ("upgrade 升级", "downgrade 降级"),
    ("encrypt encrypted encryption 加密", "decrypt decrypted decryption 解密"),
    ("hot warm 热", "cold cool 冷"),
    ("fast faster quick quickly 快", "slow slower slowly 慢"),
    ("public 公开", "private 私有"),
    ("internal 内部", "external 外部"),
    ("positive 阳性", "negative 阴性"),
    ("win gain 赢", "lose loss 输"),
)
PREFIXES = ("un", "in", "im", "ir", "il", "dis", "non")
UNITS = frozenset(
    "mg g kg µg mcg ug ng ml l dl liter liters litre litres oz lb lbs pound pounds ton tons km m cm mm nm "
    "mile miles ft feet foot inch inches yard yards b kb mb gb tb pb kib mib gib tib byte bytes bit bits "
    "kbps mbps gbps hz khz mhz ghz c f celsius fahrenheit kelvin second seconds sec secs ms millisecond "
    "milliseconds minute minutes mins hour hours h hr hrs day days week weeks month months year years "
    "decade decades percent mmol mol iu cal kcal calorie calories joule joules w kw kwh watt watts volt "
    "volts v amp amps usd eur gbp cny rmb dollar dollars euro euros pence cent cents yuan "
    "毫克 克 千克 公斤 微克 毫升 升 公里 千米 米 厘米 毫米 英里 秒 毫秒 分钟 "
    "小时 天 周 星期 月 年 元 美元 欧元 度".split()
)
DATES = frozenset(
    "january february march april june july august september october november december jan feb mar apr "
    "jun jul aug sep sept oct nov dec monday tuesday wednesday thursday friday saturday sunday mon tue tues "
    "wed thu thur thurs fri sat sun weekday weekend weekends today tonight yesterday tomorrow morning "
    "afternoon evening night next last previous upcoming past current spring summer autumn fall winter "
    "christmas easter 今天 昨天 明天 前天 后天 今年 去年 明年 上周 下周 本周 上个月 下个月 本月 早上 上午 下午 晚上 "
    "周一 周二 周三 周四 周五 周六 周日 星期一 星期二 星期三 星期四 星期五 星期六 星期日 春天 夏天 秋天 冬天".split()
)
DIRECTIONS = frozenset(
    "from to into than versus vs cause causes caused causing affect affects lead leads trigger triggers "
    "before after over 从 到 比 导致 引起 影响 转换 迁移".split()
)
NAME_TAGS = frozenset({"nr", "ns", "nt", "nrt", "nrfg"})  # jieba: person, place, organisation names
_CJK = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
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
        negations: Negation words and characters, sorted (``n't`` counts as ``not``; a
            privative word as ``"lack"``).
        content: Content terms in order of first appearance, without numbers and negations.
        poles: ``"<group>+"`` / ``"<group>-"`` for each word of a :data:`POLES` pole it holds.
        names: The content terms written as names (see the module docstring).
        words: Its words, lower-cased (for the negating-prefix and date rules).
        directed: Whether it holds a direction word (the ``order`` rule applies).
        strict: The query encoder does not declare the question's language: its content terms
            must be the other's (rule ``content``).
    """

    numbers: tuple[str, ...]
    negations: tuple[str, ...]
    content: tuple[str, ...]
    poles: frozenset[str] = frozenset()
    names: frozenset[str] = frozenset()
    words: frozenset[str] = frozenset()
    directed: bool = False
    strict: bool = False


def terms(text: str, language: Language, model_languages: frozenset[str] | None = None) -> Terms:
    """The guard's view of ``text``, analysed as the collection's ``language`` analyses it.

    Args:
        text: The question.
        language: The collection's analysis language.
        model_languages: What the query encoder declares (:attr:`embedding.card.ModelCard.languages`:
            ISO 639-1 codes, ``"*"`` for any); ``None``: any. A question in a language it does not
            declare (CJK: ``zh``; Latin letters: ``en``) is compared strictly.
    """
    lowered = _uncontract(text.casefold())
    numbers = [number_form(m.group()) for m in _NUMBER.finditer(lowered)]
    negations = [c for c in lowered if c in CJK_NEGATIONS and not _in_privative(lowered, c)]
    words, names = _words(_uncontract(text), language)
    for word in words:
        if word in NUMBER_WORDS:
            numbers.append(NUMBER_WORDS[word])
        if word in NEGATIONS:
            negations.append(word)
        elif word in PRIVATIVES:
            negations.append("lack")
    skip = _skipped(language)
    content: dict[str, None] = {}
    for term in tokenize(lowered, language):
        if term.startswith("#") or term in skip or _NUMBER.fullmatch(term) or term in CJK_NEGATIONS:
            continue  # '#' terms are BM25's CJK bigrams; jieba's words stand for the text
        content.setdefault(term, None)
    poles = _poles()
    held = frozenset(p for w in words for f in _forms(w) for p in poles.get(f, ()))
    held |= frozenset(p for w in words if _CJK.match(w) for pw, ps in _cjk_poles() if pw in w for p in ps)
    marked = frozenset(t for name in names for t in (tokenize(name, language) or [name]))
    return Terms(
        tuple(sorted(numbers)), tuple(sorted(negations)), tuple(content), held, marked, frozenset(words),
        any(w in DIRECTIONS for w in words), not _understood(text, model_languages),
    )


def contradiction(a: Terms, b: Terms) -> str | None:
    """Why two questions must not share an answer, or ``None`` when their words do not contradict.

    Returns:
        ``"number"``, ``"negation"``, ``"content"``, ``"antonym"``, ``"unit"``, ``"date"``, ``"entity"`` or
        ``"order"`` (see the module docstring).
    """
    if a.numbers != b.numbers:
        return "number"
    if a.negations != b.negations:
        return "negation"
    if (a.strict or b.strict) and set(a.content) != set(b.content):
        return "content"
    if _opposed(a, b) or _opposed(b, a) or _prefixed(a, b) or _prefixed(b, a):
        return "antonym"
    only_a, only_b = set(a.content) - set(b.content), set(b.content) - set(a.content)
    differing = only_a | only_b
    if differing & _stemmed(UNITS) or (a.words ^ b.words) & UNITS:
        return "unit"
    if differing & _stemmed(DATES) or (a.words ^ b.words) & DATES:
        return "date"
    if (only_a & a.names) or (only_b & b.names):
        return "entity"
    if not differing and a.content != b.content and (a.directed or b.directed):
        return "order"
    return None


def _understood(text: str, model_languages: frozenset[str] | None) -> bool:
    """Whether the encoder declares the scripts of ``text`` (CJK: ``zh``; Latin letters: ``en``)."""
    if model_languages is None or "*" in model_languages:
        return True
    if _CJK.search(text) and "zh" not in model_languages:
        return False
    return not (re.search("[A-Za-z]", text) and "en" not in model_languages)


def _opposed(a: Terms, b: Terms) -> bool:
    """``a`` holds a pole ``b`` lacks while ``b`` holds its opposite that ``a`` lacks."""
    for pole in a.poles - b.poles:
        opposite = pole[:-1] + ("-" if pole.endswith("+") else "+")
        if opposite in b.poles and opposite not in a.poles:
            return True
    return False


def _prefixed(a: Terms, b: Terms) -> bool:
    """A word of ``a`` only is a word of ``b`` only with a negating prefix ("unsafe" / "safe")."""
    only_a, only_b = a.words - b.words, b.words - a.words
    for word in only_a:
        for prefix in PREFIXES:
            rest = word[len(prefix):]
            if word.startswith(prefix) and len(rest) >= 4 and rest in only_b:
                return True
    return False


def _words(text: str, language: Language) -> tuple[list[str], list[str]]:
    """``text``'s words, lower-cased (CJK runs cut by jieba), and those written as names."""
    words: list[str] = []
    names: list[str] = []
    first = True
    for run in re.split(f"({_CJK.pattern}+)", text):
        if not run:
            continue
        if _CJK.match(run):
            if language == "en":
                words.extend(run)
                continue
            for pair in jieba.posseg.lcut(run):
                words.append(pair.word)
                if pair.flag in NAME_TAGS:
                    names.append(pair.word)
            continue
        for word in _WORDS.findall(run):
            lowered = word.casefold()
            words.append(lowered)
            if _named(word, first):
                names.append(lowered)
            first = False
    return words, names


def _named(word: str, first: bool) -> bool:
    """Written as a name: capitalised (not first), all capitals, letters with digits, or one letter."""
    if len(word) == 1:
        return word.isalpha()
    if any(c.isdigit() for c in word) and any(c.isalpha() for c in word):
        return True
    if word.isupper() and word.isalpha():
        return True
    return not first and word[0].isupper()


def _in_privative(text: str, char: str) -> bool:
    """``char`` is part of a privative word of ``text`` (不足: a lack, not a negation)."""
    return any(char in p and p in text for p in PRIVATIVES if not p.isascii())


def _uncontract(text: str) -> str:
    """``"doesn't"`` -> ``"does not"``, ``"can't"`` -> ``"can not"``, ``"it's"`` -> ``"it"``."""
    for pattern, replacement in _CONTRACTIONS:
        text = pattern.sub(replacement, text)
    return text


def number_form(raw: str) -> str:
    """``"1,000"`` -> ``"1000"``, ``"5.0"`` -> ``"5"``; a decimal comma (``"2,5"``) stays apart from 25."""
    if re.fullmatch(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?", raw):
        raw = raw.replace(",", "")
    try:
        value = float(raw.replace(",", "."))
    except ValueError:
        return raw
    return f"{value:g}" if value < 1e15 else raw


@lru_cache(maxsize=1)
def _poles() -> dict[str, tuple[str, ...]]:
    """Word -> the poles it is on (``"<group>+"``/``"<group>-"``); every word also under its English stem."""
    out: dict[str, list[str]] = {}
    for group, (plus, minus) in enumerate(POLES):
        for sign, words in (("+", plus), ("-", minus)):
            for word in words.split():
                for form in _forms(word):
                    out.setdefault(form, []).append(f"{group}{sign}")
    return {w: tuple(dict.fromkeys(p)) for w, p in out.items()}


@lru_cache(maxsize=1)
def _cjk_poles() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The CJK pole words of two characters or more (found inside a longer jieba word: 测试通过)."""
    return tuple((w, p) for w, p in _poles().items() if _CJK.match(w) and len(w) >= 2)


@lru_cache(maxsize=8192)
def _forms(word: str) -> tuple[str, ...]:
    """``word`` and its English stem (the pole lists hold surface words; questions bring inflections)."""
    return (word, *tokenize(word, "en")) if word.isascii() else (word,)


@lru_cache(maxsize=4)
def _stemmed(words: Iterable[str]) -> frozenset[str]:
    """``words`` and their analysed forms (in every language's analysis)."""
    return frozenset(f for w in words for lang in ("en", "zh") for f in (w, *tokenize(w, lang)))


@lru_cache(maxsize=4)
def _skipped(language: Language) -> frozenset[str]:
    """Question words, negations and number words as ``language``'s analysis spells them."""
    words = (*QUESTION_WORDS, *NEGATIONS, *PRIVATIVES, *NUMBER_WORDS)
    return frozenset(t for w in words for t in (tokenize(w, language) or [w]))
