import random

import pytest

from indexing.chunking import chunk_text, count_tokens, document_id_of, make_chunk_id
from quarry.errors import InvalidRequest

WORDS = ["alpha", "beta,", "gamma.", "机器", "学习", "δ", "(x)", "  ", "\n", "3.14", "e-mail", "東京"]


@pytest.mark.parametrize("seed", range(30))
def test_chunks_are_contiguous_capped_and_overlapping(seed: int) -> None:
    rng = random.Random(seed)
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 400)))
    size = rng.randint(1, 60)
    overlap = rng.randint(0, size - 1)
    chunks = chunk_text(text, size, overlap)
    total = count_tokens(text)
    if total == 0:
        assert chunks == []
        return
    for c in chunks:
        assert text[c.start : c.end] == c.text  # a contiguous slice of the source
        assert count_tokens(c.text) <= size  # the size is a hard cap
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert b.start > a.start
        assert count_tokens(text[b.start : a.end]) == overlap if a.end > b.start else overlap == 0
    covered = sum(count_tokens(c.text) for c in chunks) - overlap * (len(chunks) - 1)
    assert covered == total  # nothing lost, nothing repeated beyond the overlap
    assert [c.position for c in chunks] == list(range(len(chunks)))


@pytest.mark.parametrize(("size", "overlap"), [(10, 10), (10, 11), (0, 0), (5, -1)])
def test_bad_overlap_is_rejected(size: int, overlap: int) -> None:
    with pytest.raises(InvalidRequest):
        chunk_text("some text here", size, overlap)


@pytest.mark.parametrize("document_id", ["4462079", "a:b:c", ":", "::", "doc:0:ff", "文档:1", " ", "x" * 300])
@pytest.mark.parametrize("position", [0, 7, 10_000])
def test_document_id_is_recovered_from_any_chunk_id(document_id: str, position: int) -> None:
    # Document ids are arbitrary strings, colons included: the digest never holds one.
    assert document_id_of(make_chunk_id(document_id, position, "58a7e98b9852")) == document_id
