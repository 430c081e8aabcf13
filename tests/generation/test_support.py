"""The support check on hand-written cases: copied or paraphrased sentences are supported, changed facts are not.

Each case is (cited sentence, cited chunk, language, expected ``supported``). Positives copy a
sentence of the chunk or paraphrase it closely (order, inflection, function words, a dropped
clause); negatives keep most words and change a number, the negation, an entity or the
direction of an effect. Precision and recall of ``supported`` must be >= 0.9 each.
"""

from __future__ import annotations

import pytest

from generation.citations import SourceRef, resolve
from generation.support import check, negated, numbers

ACME = (
    "Acme Cloud encrypts data at rest with AES-256. Keys are rotated every 90 days and stored in a "
    "hardware security module. Customer data never leaves the EU region."
)
VITD = (
    "In a cohort of 12,000 adults followed for 10 years, low vitamin D levels were associated with a "
    "higher risk of colorectal cancer. No association was found for breast cancer."
)
TRIAL = (
    "The randomized trial enrolled 450 patients in Germany. Metformin reduced HbA1c by 1.2 percent "
    "after 24 weeks. Adverse events were rare and mostly gastrointestinal."
)
PYTHON = (
    "Python 3.12 removed the distutils module. Developers should use setuptools instead. "
    "The release was published in October 2023."
)
MICE = (
    "Mice lacking the TNF receptor did not develop arthritis. Treatment with antibody 4E3 increased "
    "survival by 30% in wild-type animals."
)
ZH_BANK = "中国人民银行于2023年将存款准备金率下调0.25个百分点。此举旨在降低融资成本，支持实体经济。"
ZH_CITY = "上海是中国最大的城市，常住人口约2500万。北京是中国的首都。"
ZH_DRUG = "研究发现，阿司匹林可以降低心脏病发作的风险。但是长期服用会增加胃出血的风险。"
ZH_SCHOOL = "该校共有三千名学生，其中女生占百分之五十五。学校成立于1952年，位于杭州。"
ZH_APP = "用户可以在设置中开启双重认证。系统不会保存用户的明文密码。"

CASES: list[tuple[str, str, str, bool]] = [
    # --- copied: supported
    ("Acme Cloud encrypts data at rest with AES-256.", ACME, "en", True),
    ("Keys are rotated every 90 days and stored in a hardware security module.", ACME, "en", True),
    ("Low vitamin D levels were associated with a higher risk of colorectal cancer.", VITD, "en", True),
    ("Metformin reduced HbA1c by 1.2 percent after 24 weeks.", TRIAL, "en", True),
    ("Python 3.12 removed the distutils module.", PYTHON, "en", True),
    ("Mice lacking the TNF receptor did not develop arthritis.", MICE, "en", True),
    ("中国人民银行于2023年将存款准备金率下调0.25个百分点。", ZH_BANK, "zh", True),
    ("上海是中国最大的城市，常住人口约2500万。", ZH_CITY, "zh", True),
    ("研究发现，阿司匹林可以降低心脏病发作的风险。", ZH_DRUG, "zh", True),
    ("系统不会保存用户的明文密码。", ZH_APP, "zh", True),
    # --- closely paraphrased: supported
    ("Data at rest is encrypted by Acme Cloud using AES-256.", ACME, "en", True),
    ("Customer data never leaves the EU region.", ACME, "en", True),
    ("Keys are stored in a hardware security module and rotated every 90 days.", ACME, "en", True),
    ("Low levels of vitamin D are associated with higher colorectal cancer risk.", VITD, "en", True),
    ("No association with breast cancer was found.", VITD, "en", True),
    ("The trial enrolled 450 patients in Germany.", TRIAL, "en", True),
    ("After 24 weeks, metformin reduced HbA1c by 1.2 percent.", TRIAL, "en", True),
    ("Adverse events were rare.", TRIAL, "en", True),
    ("The distutils module was removed in Python 3.12; developers should use setuptools.", PYTHON, "en", True),
    ("Antibody 4E3 increased survival of wild-type animals by 30%.", MICE, "en", True),
    ("2023年，中国人民银行下调存款准备金率0.25个百分点。", ZH_BANK, "zh", True),
    ("此举是为了降低融资成本、支持实体经济。", ZH_BANK, "zh", True),
    ("北京是中国的首都。", ZH_CITY, "zh", True),
    ("长期服用阿司匹林会增加胃出血风险。", ZH_DRUG, "zh", True),
    ("该校学生共三千名，女生占百分之五十五。", ZH_SCHOOL, "zh", True),
    ("用户可以在设置里开启双重认证。", ZH_APP, "zh", True),
    # --- a number differs: not supported
    ("Keys are rotated every 30 days and stored in a hardware security module.", ACME, "en", False),
    ("Acme Cloud encrypts data at rest with AES-128.", ACME, "en", False),
    ("In a cohort of 1,200 adults, low vitamin D levels were associated with colorectal cancer.", VITD, "en", False),
    ("Metformin reduced HbA1c by 2.1 percent after 24 weeks.", TRIAL, "en", False),
    ("The randomized trial enrolled 540 patients in Germany.", TRIAL, "en", False),
    ("Python 3.11 removed the distutils module.", PYTHON, "en", False),
    ("中国人民银行于2022年将存款准备金率下调0.25个百分点。", ZH_BANK, "zh", False),
    ("上海常住人口约3500万，是中国最大的城市。", ZH_CITY, "zh", False),
    ("该校共有五千名学生，其中女生占百分之五十五。", ZH_SCHOOL, "zh", False),
    # --- the negation differs: not supported
    ("Customer data leaves the EU region.", ACME, "en", False),
    ("An association was found for breast cancer.", VITD, "en", False),
    ("Mice lacking the TNF receptor developed arthritis.", MICE, "en", False),
    ("Adverse events were not rare.", TRIAL, "en", False),
    ("系统会保存用户的明文密码。", ZH_APP, "zh", False),
    ("研究发现，阿司匹林不能降低心脏病发作的风险。", ZH_DRUG, "zh", False),
    # --- the direction of an effect is reversed: not supported
    ("Low vitamin D levels were associated with a lower risk of colorectal cancer.", VITD, "en", False),
    ("Metformin increased HbA1c by 1.2 percent after 24 weeks.", TRIAL, "en", False),
    ("长期服用阿司匹林会减少胃出血的风险。", ZH_DRUG, "zh", False),
    ("中国人民银行于2023年将存款准备金率上调0.25个百分点。", ZH_BANK, "zh", False),
    # --- an entity differs: not supported
    ("The randomized trial enrolled 450 patients in France.", TRIAL, "en", False),
    ("Sitagliptin reduced HbA1c by 1.2 percent after 24 weeks.", TRIAL, "en", False),
    ("Treatment with antibody 7B2 increased survival by 30% in wild-type animals.", MICE, "en", False),
    ("Globex Cloud encrypts data at rest with AES-256.", ACME, "en", False),
    ("广州是中国最大的城市，常住人口约2500万。", ZH_CITY, "zh", False),
    ("学校成立于1952年，位于南京。", ZH_SCHOOL, "zh", False),
    # --- unrelated to the chunk: not supported
    ("The Eiffel Tower is 330 metres tall.", ACME, "en", False),
    ("太阳从东方升起。", ZH_APP, "zh", False),
]


def test_the_check_reaches_precision_and_recall_of_0_9_on_the_hand_written_cases() -> None:
    assert len(CASES) >= 40
    assert {lang for *_, lang, _ in CASES} == {"en", "zh"}
    tp = fp = fn = 0
    wrong = []
    for claim, chunk, lang, expected in CASES:
        got = check(claim, chunk, lang, 0.5)  # type: ignore[arg-type]
        tp += got.supported and expected
        fp += got.supported and not expected
        fn += expected and not got.supported
        if got.supported != expected:
            wrong.append((claim, got.reason, round(got.score, 2)))
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    assert precision >= 0.9 and recall >= 0.9, (precision, recall, wrong)


def test_a_copied_sentence_is_supported_with_its_quote() -> None:
    got = check("Acme Cloud encrypts data at rest with AES-256.", ACME, "en", 0.5)
    assert got.supported and got.score == 1.0 and got.quote == "Acme Cloud encrypts data at rest with AES-256."


def test_a_marker_that_opens_the_answer_cites_the_text_after_it() -> None:
    """``[1] Title. Copied sentence`` cites what follows the marker (there is nothing before it)."""
    source = SourceRef(1, "whitepaper", "whitepaper#0", ACME, "Security Whitepaper")
    answer = "[1] Security Whitepaper. Acme Cloud encrypts data at rest with AES-256, keys rotated every 90 days."
    (citation,) = resolve(answer, [source], "en", 0.5).citations
    assert citation.supported and citation.quote, citation
    assert citation.title == "Security Whitepaper"


@pytest.mark.parametrize(("text", "expected"), [
    ("1,000 mg twice", {"1000", "2"}), ("0.25个百分点", {"0.25"}), ("三千名学生", {"3000"}),
    ("百分之五十五", {"55"}), ("一样的统一标准", set()), ("一个月", {"1"}), ("AES-256", {"256"}),
])
def test_numbers_are_normalised(text: str, expected: set[str]) -> None:
    assert numbers(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("It does not work.", True), ("It doesn't work.", True), ("It is not without risk.", False),
    ("系统不会保存密码", True), ("系统不断改进", False), ("It failed to reduce pain.", True),
])
def test_negation(text: str, expected: bool) -> None:
    assert negated(text) is expected
