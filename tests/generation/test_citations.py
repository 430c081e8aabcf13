import random

import pytest

from generation.citations import CitationScanner, SourceRef, claim_of, find_markers, numbers_of, resolve

SOURCES = [
    SourceRef(1, "d1", "d1:0", "Smoking causes lung cancer in most patients."),
    SourceRef(2, "d2", "d2:0", "Vitamin D deficiency is common in northern countries."),
]


@pytest.mark.parametrize(
    ("text", "numbers"),
    [
        ("a [3] b", [(3,)]),
        ("a [1, 2] b", [(1, 2)]),
        ("a [1-3] b", [(1, 2, 3)]),
        ("a [1–3]", [(1, 2, 3)]),
        ("a 【2】 b", [(2,)]),
        ("a (3) b", [(3,)]),
        ("a [Source 2] and [doc 1]", [(2,), (1,)]),
        ("a [1][2]", [(1,), (2,)]),
        ("in (2019) and [x] and (12345)", []),
        ("a [1-1000]", [(1, 1000)]),  # a range too wide to expand: its ends only
    ],
)
def test_marker_forms(text: str, numbers: list[tuple[int, ...]]) -> None:
    assert [m.numbers for m in find_markers(text)] == numbers


def test_numbers_of() -> None:
    assert numbers_of("1, 2 and 4") == (1, 2, 4)
    assert numbers_of("2-4, 7") == (2, 3, 4, 7)


def test_out_of_range_is_dropped_and_counted_never_remapped() -> None:
    scanner = resolve("Smoking causes cancer [3]. Vitamin D [2][0].", SOURCES, "en", 0.5)
    assert scanner.dropped == 2
    assert [(c.marker, c.chunk_id) for c in scanner.citations] == [(2, "d2:0")]


def test_ranges_lists_and_fullwidth_resolve() -> None:
    scanner = resolve("Both [1-3]. Either [1, 2]. Vitamin 【2】.", SOURCES, "en", 0.5)
    assert [c.marker for c in scanner.citations] == [1, 2, 1, 2, 2]
    assert scanner.dropped == 1  # the 3 of [1-3]
    c = scanner.citations[-1]
    assert c.text == "【2】" and c.document_id == "d2"


def test_supported_by_lexical_overlap() -> None:
    scanner = resolve("Smoking causes lung cancer [1]. The moon is made of cheese [2].", SOURCES, "en", 0.5)
    first, second = scanner.citations
    assert first.supported and first.score == 1.0 and first.quote.startswith("Smoking")
    assert not second.supported and second.score == 0.0


def test_claim_is_the_sentence_before_the_marker() -> None:
    text = "Vitamin D is low in the north. [2] Smoking kills [1]."
    assert claim_of(text, text.index("[2]")) == "Vitamin D is low in the north."
    assert claim_of(text, text.index("[1]")) == "Smoking kills"


def test_streamed_pieces_give_the_same_citations_as_the_whole_text() -> None:
    text = "Smoking causes lung cancer [1, 2]. Vitamin D 【2】 is common (1). Not [3] nor [1-2]."
    whole = resolve(text, SOURCES, "en", 0.5)
    rng = random.Random(7)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(text)), 12))
        scanner = CitationScanner(SOURCES, "en", 0.5)
        for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
            scanner.feed(text[a:b])
        assert scanner.citations == whole.citations and scanner.dropped == whole.dropped == 1


def test_a_parenthesised_number_inside_a_formula_is_not_a_marker() -> None:
    """``1,25(OH)(2)D`` (a vitamin D metabolite) holds no citation; a ``(2)`` after a word and a space does."""
    from generation.citations import find_markers

    assert find_markers("Levels of 1,25(OH)(2)D were low.") == []
    assert find_markers("H(2)O and CO(2) rose.") == []
    assert find_markers("Vitamin D lowers risk (2).")[0].numbers == (2,)
    assert find_markers("Vitamin D lowers risk (1, 2), as shown.")[0].numbers == (1, 2)
