import asyncio
from collections.abc import Sequence

from generation.openai_compat import approx_tokens
from generation.prompt import Candidate, build_prompt


async def _count(texts: Sequence[str]) -> list[int]:
    return [approx_tokens(t) for t in texts]


def _candidates(n: int, words: int) -> list[Candidate]:
    return [Candidate(f"d{i}", f"d{i}:0", " ".join(f"word{i}x{j}" for j in range(words)), 1.0 / (i + 1))
            for i in range(n)]


def test_whole_chunks_in_rank_order_then_one_cut_then_left_out() -> None:
    cands = _candidates(5, 60)  # ~ 60 * 9 chars / 3 = 180+ tokens each
    prompt = asyncio.run(build_prompt("q?", cands, 450, _count, "approx"))
    assert [s.status for s in prompt.sent] == ["sent", "sent", "cut"]
    assert [s.number for s in prompt.sent] == [1, 2, 3]
    assert [c.document_id for c in prompt.left_out] == ["d3", "d4"]
    assert prompt.context_tokens == approx_tokens(prompt.context) <= 450
    assert prompt.sent[2].text.endswith(" …") and cands[2].text.startswith(prompt.sent[2].text[:-2])
    assert "[1] word0x0" in prompt.messages[1]["content"] and "Question: q?\n" in prompt.messages[1]["content"]


def test_everything_fits() -> None:
    prompt = asyncio.run(build_prompt("q", _candidates(2, 5), 1000, _count, "approx"))
    assert [s.status for s in prompt.sent] == ["sent", "sent"] and prompt.left_out == []


def test_no_room_to_cut_leaves_the_chunk_out() -> None:
    cands = _candidates(2, 60)
    first = approx_tokens("[1] " + cands[0].text)
    prompt = asyncio.run(build_prompt("q", cands, first + 5, _count, "approx"))
    assert [s.status for s in prompt.sent] == ["sent"] and len(prompt.left_out) == 1


class _Recorder:
    """An exact counter (``ratio`` tokens per approximated token) that records what it was asked."""

    def __init__(self, ratio: float = 1.0) -> None:
        self.ratio = ratio
        self.calls: list[list[str]] = []

    async def __call__(self, texts: Sequence[str]) -> list[int]:
        self.calls.append(list(texts))
        return [int(approx_tokens(t) * self.ratio) for t in texts]


def test_one_exact_count_of_the_block_when_the_estimate_holds() -> None:
    # issue 21: the server tokenizer was asked once per chunk, for the separator and per cut
    count = _Recorder()
    prompt = asyncio.run(build_prompt("q", _candidates(5, 60), 450, count, "server"))
    assert count.calls == [[prompt.context]] and prompt.counts == 1
    assert [s.status for s in prompt.sent] == ["sent", "sent", "cut"]


def test_an_estimate_that_falls_short_is_trimmed_until_the_exact_count_fits() -> None:
    count = _Recorder(ratio=1.4)  # the model's tokenizer counts 40% more than the estimate
    prompt = asyncio.run(build_prompt("q", _candidates(5, 60), 450, count, "server"))
    assert prompt.context_tokens == int(approx_tokens(prompt.context) * 1.4) <= 450
    assert 2 <= len(count.calls) <= 6 and prompt.sent and prompt.sent[-1].status == "cut"
    assert len(prompt.sent) + len(prompt.left_out) == 5
