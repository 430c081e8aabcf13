"""Loading the real BEIR folders in shared/data, and the errors on malformed input."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from eval.beir import iter_corpus, list_splits, load_qrels, load_queries, load_split
from quarry.errors import InvalidDocument, InvalidRequest


def test_scifact_test_split(shared_data: Path) -> None:
    beir = shared_data / "scifact"
    split = load_split(beir, "test")
    assert split.name == "test"
    assert len(split.queries) == 300
    assert set(split.queries) == set(split.qrels)
    assert sum(len(docs) for docs in split.qrels.values()) == 339
    assert all(grade == 1 for docs in split.qrels.values() for grade in docs.values())
    assert split.queries["1"] == "0-dimensional biomaterials show inductive properties."
    assert len(load_queries(beir)) == 1109  # all splits together
    assert list_splits(beir) == ["test", "train"]


def test_scifact_corpus_streams_5183_documents(shared_data: Path) -> None:
    docs = iter_corpus(shared_data / "scifact")
    first = next(docs)  # lazy: a generator, nothing read ahead
    assert set(first) == {"_id", "title", "text", "metadata"}
    assert first["_id"] == "4983" and first["title"].startswith("Microstructural development")
    rest = list(docs)
    ids = [first["_id"]] + [d["_id"] for d in rest]
    assert len(ids) == 5183 == len(set(ids))
    assert all(isinstance(d["text"], str) and isinstance(d["metadata"], dict) for d in rest)
    judged = {
        doc for docs in load_split(shared_data / "scifact", "test").qrels.values() for doc in docs
    }
    assert judged <= set(ids)


def test_corpus_reader_accepts_the_corpus_file_path(shared_data: Path) -> None:
    assert next(iter_corpus(shared_data / "scifact" / "corpus.jsonl"))["_id"] == "4983"


def test_cmrc2018_loads_dev_and_test(shared_data: Path) -> None:
    beir = shared_data / "cmrc2018-retrieval"
    assert list_splits(beir) == ["dev", "test"]
    test = load_split(beir, "test")
    dev = load_split(beir, "dev")
    assert (len(test.queries), len(dev.queries)) == (3219, 1002)
    assert not set(test.queries) & set(dev.queries)
    assert test.queries["DEV_0_QUERY_0"] == "《战国无双3》是由哪两个公司合作开发的？"
    assert test.qrels["DEV_0_QUERY_0"] == {"DEV_0": 1}
    docs = list(iter_corpus(beir))
    assert len(docs) == 1104
    assert docs[0]["title"] == "战国无双3"
    judged = {doc for split in (test, dev) for docs_ in split.qrels.values() for doc in docs_}
    assert judged <= {d["_id"] for d in docs}


def test_unknown_split_lists_the_available_ones(shared_data: Path) -> None:
    with pytest.raises(InvalidRequest, match=r"no split 'dev'.*\['test', 'train'\]"):
        load_split(shared_data / "scifact", "dev")


def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="does not exist"):
        list(iter_corpus(tmp_path / "nope"))


def test_malformed_corpus_line_names_the_line(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": "a", "text": "ok"}\n\n{"_id": "b", "text": \n', encoding="utf-8")
    with pytest.raises(InvalidDocument, match=r"corpus.jsonl:line 3: invalid JSON"):
        list(iter_corpus(tmp_path))
    corpus.write_text('{"_id": "a"}\n', encoding="utf-8")
    with pytest.raises(InvalidDocument, match=r"line 1: field 'text' must be a string"):
        list(iter_corpus(corpus))


def test_integer_ids_become_text_and_missing_fields_are_filled(tmp_path: Path) -> None:
    (tmp_path / "corpus.jsonl").write_text('{"_id": 7, "text": "t"}\n', encoding="utf-8")
    assert list(iter_corpus(tmp_path)) == [{"_id": "7", "title": "", "text": "t", "metadata": {}}]


def test_bad_qrels_header_and_rows(tmp_path: Path) -> None:
    (tmp_path / "qrels").mkdir()
    qrels = tmp_path / "qrels" / "test.tsv"
    qrels.write_text("qid\tdocid\trel\nq\td\t1\n", encoding="utf-8")
    with pytest.raises(InvalidDocument, match="line 1: header must be"):
        load_qrels(tmp_path, "test")
    qrels.write_text("query-id\tcorpus-id\tscore\nq\td\thigh\n", encoding="utf-8")
    with pytest.raises(InvalidDocument, match="line 2: score 'high' is not an integer"):
        load_qrels(tmp_path, "test")


def test_judged_query_missing_from_queries_file(shared_data: Path, tmp_path: Path) -> None:
    shutil.copy(shared_data / "scifact" / "queries.jsonl", tmp_path / "queries.jsonl")
    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n1\t31715818\t1\nnot-a-query\t1\t1\n", encoding="utf-8"
    )
    with pytest.raises(InvalidDocument, match="1 judged queries are missing"):
        load_split(tmp_path, "test")


def test_repeated_judgements_and_queries_are_errors_not_last_wins(tmp_path: Path) -> None:
    """A repeated (query, document) row or query id would silently replace the earlier one."""
    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq\td\t1\nq\te\t1\nq\td\t0\n", encoding="utf-8"
    )
    with pytest.raises(InvalidDocument, match="test.tsv.*line 4: query 'q' and document 'd' are judged twice"):
        load_qrels(tmp_path, "test")
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"_id": "q", "text": "cats"}\n{"_id": "r", "text": "dogs"}\n{"_id": "q", "text": "x"}\n')
    with pytest.raises(InvalidDocument, match="line 3: duplicate query id 'q'"):
        load_queries(tmp_path)
