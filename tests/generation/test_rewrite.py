"""The follow-up rewrite's rules and its check of an LLM's reply (pure functions, no server)."""

from __future__ import annotations

import pytest

from generation.rewrite import check_rewrite, needs_context, rewrite_messages, rule_rewrite

FIRST = "Does vitamin D deficiency increase the risk of cancer?"


@pytest.mark.parametrize(("follow_up", "expected"), [
    ("and in children?", "Does vitamin D deficiency increase the risk of cancer in children?"),
    ("And in children", "Does vitamin D deficiency increase the risk of cancer in children?"),
    ("what about older adults?", "Does vitamin D deficiency increase the risk of cancer older adults?"),
    ("Does it affect metastasis?", "Does vitamin D deficiency increase the risk of cancer: Does it affect metastasis?"),
    ("children?", "Does vitamin D deficiency increase the risk of cancer: children?"),
    ("How does smoking affect lung function in adults?", "How does smoking affect lung function in adults?"),
    ("and?", "Does vitamin D deficiency increase the risk of cancer?"),
])
def test_rules_join_a_follow_up_that_leans_on_the_conversation(follow_up: str, expected: str) -> None:
    assert rule_rewrite(FIRST, follow_up) == expected


def test_rules_read_chinese_follow_ups() -> None:
    assert rule_rewrite("维生素D缺乏会增加癌症风险吗？", "那儿童呢？") == "维生素D缺乏会增加癌症风险吗 儿童?"
    assert needs_context("还有老年人呢") and not needs_context("How does smoking affect lung function in adults?")


@pytest.mark.parametrize(("reply", "kept", "reason"), [
    ("Does vitamin D deficiency raise cancer risk in children?",
     "Does vitamin D deficiency raise cancer risk in children?", None),
    ('Standalone query: "Vitamin D deficiency and cancer risk in children"\nExplanation: ...',
     "Vitamin D deficiency and cancer risk in children", None),
    (FIRST, FIRST, "dropped_follow_up"),  # SmolLM2-135M's usual reply: the earlier question again
    ("Children are lovely.", "Children are lovely.", "no_context"),
    ("   ", "", "empty"),
    ("children " * 100, ("children " * 100).strip(), "too_long"),
])
def test_the_check_keeps_a_standalone_rewrite_and_refuses_junk(reply: str, kept: str, reason: str | None) -> None:
    assert check_rewrite(reply, "and in children?", [FIRST]) == (kept, reason)


def test_the_prompt_holds_the_earlier_questions_and_the_follow_up() -> None:
    messages = rewrite_messages(["What is vitamin D?", FIRST], "and in children?")
    assert messages[0]["role"] == "system" and messages[-1]["role"] == "user"
    assert messages[-1]["content"] == (f"Earlier question: What is vitamin D?\nEarlier question: {FIRST}\n"
                                       "Last question: and in children?")
