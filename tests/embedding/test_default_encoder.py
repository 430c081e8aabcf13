"""The default encoder (issue 25): ONNX int8 of the packaged MiniLM, exported once, torch one setting away."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

from embedding.onnx import OnnxEmbedder
from embedding.sentence_transformers import SentenceTransformerEmbedder
from indexing.sources import read_documents
from quarry.service import Quarry
from quarry.settings import EmbeddingSettings, Settings

REPO = Path(__file__).resolve().parents[2]
DEFAULT = "onnx://all-MiniLM-L6-v2?quantize=int8&threads=1"


def test_the_default_is_onnx_int8_on_one_thread_and_torch_is_one_setting_away(tmp_path: Path) -> None:
    assert EmbeddingSettings().url == DEFAULT
    quarry = Quarry(Settings(data_dir=tmp_path / "a"))
    try:
        assert isinstance(quarry.embedder, OnnxEmbedder)
        assert quarry.embedder.quantize == "int8" and quarry.embedder._threads == 1
    finally:
        quarry.close()
    torch = Quarry(Settings(data_dir=tmp_path / "b", embedding=EmbeddingSettings(url="torch://all-MiniLM-L6-v2")))
    try:
        assert isinstance(torch.embedder, SentenceTransformerEmbedder)
    finally:
        torch.close()


def test_a_collection_made_with_torch_is_searched_and_written_with_the_default(
    tmp_path: Path, shared_data: Path
) -> None:
    """A collection ingested before the default changed (torch://) keeps working: no 409, no degradation.

    torch:// and onnx:// record the same model fingerprint (docs/embedding.md, "Model identity").
    """
    docs = list(itertools.islice(read_documents(shared_data / "scifact"), 40))
    torch = Quarry(Settings(data_dir=tmp_path, embedding=EmbeddingSettings(url="torch://all-MiniLM-L6-v2")))
    try:
        torch.create_collection("made_with_torch")
        torch.upsert("made_with_torch", docs[:30])
        made_by = torch.get_collection("made_with_torch").embedding_fingerprint
        before = {d.id: [h.document_id for h in torch.search("made_with_torch", d.title, mode="dense").hits][:3]
                  for d in docs[:10]}
    finally:
        torch.close()
    default = Quarry(Settings(data_dir=tmp_path))  # the same data dir, the default encoder
    try:
        default.warm_up()
        assert isinstance(default.embedder, OnnxEmbedder) and default.embedder.fingerprint == made_by
        for doc in docs[:10]:
            for mode in ("dense", "hybrid"):
                result = default.search("made_with_torch", doc.title, mode=mode)
                assert result.degraded == [], (mode, result.degraded)
            dense = [h.document_id for h in default.search("made_with_torch", doc.title, mode="dense").hits]
            assert dense[0] == before[doc.id][0] == doc.id  # a title finds its own document
        report = default.upsert("made_with_torch", docs[30:])  # writes with the new default: no ModelMismatch
        assert report.embedded > 0 and default.describe("made_with_torch")["documents"] == 40
        assert default.get_collection("made_with_torch").embedding_fingerprint == made_by
    finally:
        default.close()


def test_processes_sharing_an_empty_cache_export_once(tmp_path: Path) -> None:
    """Three processes open the default encoder on one empty model cache: one export, one file, all served.

    The first takes ``export.lock`` and exports (its two progress lines on stderr); the others
    wait on the lock, then open the file it wrote.
    """
    code = (
        "from embedding.factory import open_embedder; from quarry.settings import Settings; "
        "s = Settings(); e = open_embedder(s.embedding.url, s); e.warm_up(); "
        "print(e.onnx_path, e.embed(['ant colonies']).vectors.shape)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "QUARRY_DATA_DIR": str(tmp_path / "data"),
           "QUARRY_EMBEDDING__CACHE_DIR": str(tmp_path / "models")}
    env.pop("QUARRY_EMBEDDING__URL", None)
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=tmp_path)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outs]
    lines = {out.strip() for out, _ in outs}
    assert len(lines) == 1 and lines.pop().endswith("(1, 384)")
    stderr = "".join(err for _, err in outs)
    assert stderr.count("quarry: exporting all-MiniLM-L6-v2 to ONNX (int8-") == 1, stderr
    assert stderr.count("quarry: exported all-MiniLM-L6-v2 to model.int8-") == 1, stderr
    (folder,) = (tmp_path / "models" / "onnx").iterdir()
    names = sorted(p.name for p in folder.iterdir())
    assert names[0] == "export.lock" and names[1] == "model.fp32.onnx" and names[2].startswith("model.int8-")
    assert len(names) == 3  # no temporary file left behind
