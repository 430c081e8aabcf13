"""Structured answers: a JSON reply rendered as text with ``[n]`` markers, the same in any number of pieces."""

from __future__ import annotations

import json

import pytest

from generation.citations import SourceRef, find_markers
from generation.structured import NOT_ANSWERED, StructuredScanner, answer_schema

SOURCES = [
    SourceRef(
        1, "d1", "d1#0", "Vitamin D deficiency is associated with an increased risk of colorectal cancer.", "VitD"
    ),
    SourceRef(2, "d2", "d2#0", "Smoking causes lung cancer."),
]
REPLY = json.dumps({"sentences": [
    {"text": "Vitamin D deficiency is associated with an increased risk of colorectal cancer.", "sources": [1, 7]},
    {"text": "Smoking causes lung cancer", "sources": [2]},
]})
RENDERED = (
    "Vitamin D deficiency is associated with an increased risk of colorectal cancer [1]. "
    "Smoking causes lung cancer [2]."
)


def _run(reply: str, step: int, *, json_reply: bool = True) -> tuple[StructuredScanner, list[str]]:
    scanner = StructuredScanner(SOURCES, "en", 0.5, json=json_reply)
    deltas = []
    for i in range(0, len(reply), step):
        text, _ = scanner.feed(reply[i : i + step])
        deltas.append(text)
    text, _ = scanner.finish()
    deltas.append(text)
    return scanner, [d for d in deltas if d]


@pytest.mark.parametrize("step", [1, 2, 5, 13, 10_000])
def test_a_json_reply_renders_the_same_text_and_citations_in_any_number_of_pieces(step: int) -> None:
    scanner, deltas = _run(REPLY, step)
    assert "".join(deltas) == scanner.text == RENDERED
    assert [(c.marker, scanner.text[c.start : c.end]) for c in scanner.citations] == [(1, "[1]"), (2, "[2]")]
    assert scanner.dropped == 1  # 7 names no source that was sent
    assert all(c.supported and c.quote for c in scanner.citations)
    assert [m.numbers for m in find_markers(scanner.text)] == [(1,), (2,)]  # a free-text reader sees the same
    if step < 20:
        assert len(deltas) > 2  # the text streams as the sentence grows, not once at the end


def test_the_model_saying_the_sources_do_not_answer_is_an_abstention() -> None:
    scanner, deltas = _run('{"not_answerable": true}', 3)
    assert scanner.abstained and scanner.text == NOT_ANSWERED == "".join(deltas) and not scanner.citations


def test_a_reply_cut_by_max_tokens_keeps_its_complete_sentences() -> None:
    scanner, deltas = _run(REPLY[: REPLY.index("Smoking") + 8], 4)
    assert scanner.text.startswith(RENDERED.split(" Smoking")[0]) and "".join(deltas) == scanner.text
    assert [c.marker for c in scanner.citations] == [1]


def test_a_reply_that_is_not_json_is_read_as_free_text_from_its_first_character() -> None:
    scanner, deltas = _run("Smoking causes lung cancer [2].", 4)
    assert scanner.format == "text" and deltas[0] == "Smok" and scanner.text == "Smoking causes lung cancer [2]."
    assert [(c.marker, c.supported) for c in scanner.citations] == [(2, True)]


def test_the_schema_allows_only_the_sent_numbers_and_at_least_one_per_sentence() -> None:
    answered, declined = answer_schema([1, 2, 3])["anyOf"]
    sources = answered["properties"]["sentences"]["items"]["properties"]["sources"]
    assert sources["items"]["enum"] == [1, 2, 3] and sources["minItems"] == 1
    assert answered["properties"]["sentences"]["minItems"] == 1 and declined["required"] == ["not_answerable"]
    assert answered["properties"]["sentences"]["items"]["properties"]["text"]["maxLength"] == 600


def test_an_extractive_schema_offers_each_source_its_own_sentences_word_for_word() -> None:
    chunk = "Smoking causes lung cancer. Methods. Quitting lowers the risk within ten years."
    answered, _ = answer_schema([1, 2], {1: SOURCES[0].text, 2: chunk})["anyOf"]
    options = answered["properties"]["sentences"]["items"]["anyOf"]
    assert [o["properties"]["sources"]["items"]["const"] for o in options] == [1, 2]
    assert options[1]["properties"]["text"]["enum"] == [
        "Smoking causes lung cancer.", "Quitting lowers the risk within ten years."  # "Methods." is too short
    ]
    reply = json.dumps({"sentences": [{"sources": [2], "text": SOURCES[1].text}]})  # key order as the schema's
    scanner, _ = _run(reply, 3)
    assert scanner.text == "Smoking causes lung cancer [2]." and scanner.citations[0].supported
