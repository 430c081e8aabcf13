"""Attacks a hostile client or tenant would try, each a regression test of a hole found (and closed) on 2026-12-03.

No model and no vector store where the hole does not need one: these run in well under a second each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quarry.errors import Forbidden, InvalidRequest
from quarry.ingest_jobs import confine


def test_a_beir_folder_whose_corpus_links_out_of_the_roots_is_refused(tmp_path: Path) -> None:
    """A BEIR folder inside the root is read through its ``corpus.jsonl``: a link there to a file outside escaped.

    ``confine`` checked the folder only, and ``Source`` reads ``<folder>/corpus.jsonl`` without the
    per-file check a plain folder gets: a job over ``beir/`` ingested ``outside/corpus.jsonl``.
    """
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "beir").mkdir(parents=True)
    outside.mkdir()
    (outside / "corpus.jsonl").write_text(json.dumps({"_id": "s1", "text": "a secret beyond the root"}) + "\n")
    (root / "beir" / "corpus.jsonl").symlink_to(outside / "corpus.jsonl")
    with pytest.raises(Forbidden, match="corpus.jsonl links outside"):
        confine("beir", [root])
    # a BEIR folder whose corpus is its own (or links within the roots) is still a source
    (root / "ok").mkdir()
    (root / "ok" / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "text": "inside"}) + "\n")
    (root / "linked").mkdir()
    (root / "linked" / "corpus.jsonl").symlink_to(root / "ok" / "corpus.jsonl")
    assert confine("ok", [root]) == (root / "ok").resolve()
    assert confine("linked", [root]) == (root / "linked").resolve()


def test_a_source_path_the_os_cannot_look_up_is_a_400_not_a_500(tmp_path: Path) -> None:
    """A path segment over NAME_MAX (255 bytes) made ``Path.exists`` raise ``OSError`` (ENAMETOOLONG).

    ``POST /v1/collections/{name}/jobs {"path": "a" * 300}`` answered 500 ``InternalError``: any
    ``write`` key could fill the server log with tracebacks. Now 400 ``InvalidRequest``.
    """
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    with pytest.raises(InvalidRequest, match="cannot be looked up"):
        confine("a" * 300, [root])
    with pytest.raises(InvalidRequest, match="cannot be looked up"):
        confine("sub/" + "b" * 1000 + "/x.jsonl", [root])
