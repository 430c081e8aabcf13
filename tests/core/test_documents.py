"""One JSONL reader and one set of document rules, for JSONL files, BEIR folders and the REST body."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eval.beir import iter_corpus, load_queries
from indexing.document_rules import SourceDocument
from indexing.sources import iter_jsonl, read_jsonl
from quarry.api.models import UpsertDocuments
from quarry.api.routes.documents import documents_of
from quarry.errors import InvalidDocument, InvalidRequest

BAD: list[tuple[dict[str, Any], str]] = [
    ({"id": "", "text": "x"}, "missing or empty 'id'"),
    ({"id": "  ", "text": "x"}, "missing or empty 'id'"),
    ({"id": "x" * 257, "text": "x"}, "document id is longer than 256 characters"),
    ({"id": "e", "text": "", "title": ""}, "'text' and 'title' are both empty"),
    ({"id": "m", "text": "x", "metadata": {"bad key": 1}}, "invalid metadata field name 'bad key'"),
    ({"id": "n", "text": "x", "metadata": {"deep": {"a": 1}}}, "field 'deep' must be a string, number"),
    ({"id": "z", "text": "a\x00b"}, "'text' holds a NUL character"),
    ({"id": "s", "text": "a \udc00 b"}, "'text' holds an unpaired UTF-16 surrogate"),
]


def _jsonl(tmp_path: Path, rows: list[Any]) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _api(raw: dict[str, Any]) -> list[SourceDocument]:
    return documents_of(UpsertDocuments.model_validate({"documents": [{"id": "ok", "text": "fine"}, raw]}))


@pytest.mark.parametrize(("raw", "rule"), BAD, ids=[rule for _, rule in BAD])
def test_a_bad_document_breaks_the_same_rule_in_a_file_and_in_the_rest_body(
    tmp_path: Path, raw: dict[str, Any], rule: str
) -> None:
    with pytest.raises(InvalidDocument) as from_file:
        list(iter_jsonl(_jsonl(tmp_path, [{"id": "ok", "text": "fine"}, raw])))
    assert rule in from_file.value.message and "docs.jsonl:line 2" in str(from_file.value)
    with pytest.raises(InvalidDocument) as from_api:  # the body's model lets the value through to the rules
        _api(raw)
    said = from_api.value.message
    assert said.startswith("documents[1]: ") and rule in said
    assert from_file.value.message.endswith(f"docs.jsonl:line 2: {said.removeprefix('documents[1]: ')}")


def test_a_good_document_reads_the_same_from_a_file_and_from_the_rest_body(tmp_path: Path) -> None:
    raw = {"id": 7, "text": "body", "title": "T", "metadata": {"tags": ["a"], "n": 2, "ok": True}}
    from_file = list(iter_jsonl(_jsonl(tmp_path, [{"id": "ok", "text": "fine"}, raw])))
    assert from_file == _api(raw)
    assert from_file[1] == SourceDocument("7", "body", "T", {"tags": ["a"], "n": 2, "ok": True})


def test_one_jsonl_reader_for_documents_and_beir(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, [{"_id": "a", "text": "x"}, {"_id": "b", "text": "y"}])
    path.write_text(path.read_text(encoding="utf-8") + "\n   \n[1, 2]\n", encoding="utf-8")
    with pytest.raises(InvalidDocument, match=r"docs.jsonl:line 5: expected a JSON object, got list"):
        list(read_jsonl(path))
    with pytest.raises(InvalidDocument, match=r"line 5: expected a JSON object, got list"):
        list(iter_jsonl(path))
    with pytest.raises(InvalidDocument, match=r"line 5: expected a JSON object, got list"):
        list(iter_corpus(path))
    (tmp_path / "queries.jsonl").write_text('{"_id": "q", "text": "t"}\n{"_id": "q",\n', encoding="utf-8")
    with pytest.raises(InvalidDocument, match=r"queries.jsonl:line 2: invalid JSON"):
        load_queries(tmp_path)
    with pytest.raises(InvalidRequest, match="does not exist or is not a file"):
        list(iter_jsonl(tmp_path / "missing.jsonl"))
