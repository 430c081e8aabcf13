"""Structured answers: the LLM replies in JSON (sentences, each with its source numbers), rendered with ``[n]``.

The request carries a JSON schema (:func:`answer_schema`) through OpenAI's ``response_format``;
llama.cpp's server and vLLM constrain decoding to it (a grammar), so even a 135M model writes
well-formed citations, and only numbers of sources that were sent (the schema's ``enum``)::

    {"sentences": [{"text": "Vitamin D lowers the risk.", "sources": [1, 3]}]}

or ``{"not_answerable": true}``: the sources do not answer (an abstention, ``abstained: true``).

:class:`StructuredScanner` reads the reply as it streams (a partial JSON parse with ``jiter``,
the parser pydantic uses) and emits the answer as text a client reads: each sentence's text as it
grows, then, when the sentence is complete, its markers before its final punctuation
(``Vitamin D lowers the risk [1, 3].``). So streaming still streams (text within one or two
tokens of the model's), and the ``[n]`` markers and ``citation`` events are those of a free-text
answer: REST, SSE and chat clients see one format either way.

A reply that does not start with ``{`` (a server that ignored ``response_format``) is read as
free text with :class:`generation.citations.CitationScanner` from its first character; one that
starts as JSON but does not parse to the schema at the end is rendered as what could be read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import jiter

from generation.citations import MARKER, Citation, CitationScanner, SourceRef
from generation.support import SENTENCE_END as _SENTENCES
from generation.support import check
from indexing.text import Language

MAX_SENTENCES = 4
MAX_SOURCES_PER_SENTENCE = 3
MAX_SENTENCE_CHARS = 600  # a sentence must close: Gemma-3-270M wrote one until max_tokens, so none was cited
NOT_ANSWERED = "The sources do not answer this question."
SYSTEM = (
    "Answer the question with sentences copied from the numbered sources. Reply with JSON, for example: "
    '{"sentences": [{"text": "Vitamin C deficiency causes scurvy.", "sources": [2]}]}. '
    "Each text is a sentence from a source; sources lists the numbers of the sources it comes from. "
    'If no source answers the question, reply {"not_answerable": true}.'
)  # SmolLM2-135M copies a placeholder ("a sentence of the answer") verbatim: the example is a real sentence
EXTRACTIVE_SYSTEM = (
    "Answer the question with one or two sentences copied from the numbered sources. Reply with JSON: "
    '{"sentences": [{"sources": [N], "text": "a sentence copied from source N"}]}. '
    'If no source answers the question, reply {"not_answerable": true}.'
)
MIN_EXTRACT_CHARS = 20  # shorter pieces of a source (a heading, "Methods.") are not offered as sentences
_CONTROL = re.compile("[\x00-\x1f]")
_CLOSING = re.compile(r"[\s.!?。！？;；:：,，]*$")


def answer_schema(numbers: Sequence[int], extract: Mapping[int, str] | None = None) -> dict[str, Any]:
    """The JSON schema of an answer citing the sources ``numbers`` (the ones sent).

    One of two objects: ``{"sentences": [{"text", "sources"}, ...]}`` (1 to :data:`MAX_SENTENCES`
    sentences, each with 1 to :data:`MAX_SOURCES_PER_SENTENCE` numbers of ``numbers``), or
    ``{"not_answerable": true}``. (A flag beside the sentences let SmolLM2 answer
    ``{"answerable": true, "sentences": []}``: the ``anyOf`` leaves no such way out.)

    ``extract`` (source number -> the text sent): an extractive answer. Each sentence is then one
    source's number and one of that source's sentences word for word (``{"sources": [n],
    "text": <enum of its sentences>}``), so a constrained model can only quote what it cites.
    """
    if extract is not None:
        return _extractive_schema(numbers, extract)
    sentence = {
        "type": "object",
        "properties": {
            "text": {"type": "string", "minLength": 1, "maxLength": MAX_SENTENCE_CHARS},
            "sources": {
                "type": "array", "items": {"type": "integer", "enum": list(numbers)},
                "minItems": 1, "maxItems": MAX_SOURCES_PER_SENTENCE,
            },
        },
        "required": ["text", "sources"],
        "additionalProperties": False,
    }
    return _answered_or_declined(sentence, MAX_SENTENCES)


def source_sentences(text: str) -> list[str]:
    """The sentences of a source an extractive answer may quote (at least one: the whole text).

    Double quotes become single ones, backslashes are dropped and control characters are
    spaces: llama-cpp-python 0.3 escapes quotes twice when it turns an ``enum`` into a grammar,
    and the server then fails the request (its process exits: every later request is refused).
    The citation's ``quote`` is still read from the chunk itself.
    """
    text = _CONTROL.sub(" ", text.replace('"', "'").replace("\\", ""))
    found = [p.strip() for p in _SENTENCES.split(text) if len(p.strip()) >= MIN_EXTRACT_CHARS]
    return list(dict.fromkeys(found)) or [text.strip()]


def _extractive_schema(numbers: Sequence[int], extract: Mapping[int, str]) -> dict[str, Any]:
    options = [
        {
            "type": "object",
            "properties": {
                "sources": {"type": "array", "items": {"const": n}, "minItems": 1, "maxItems": 1},
                "text": {"enum": source_sentences(extract[n])},
            },
            "required": ["sources", "text"],
            "additionalProperties": False,
        }
        for n in numbers if n in extract
    ]
    return _answered_or_declined({"anyOf": options}, 2)


def _answered_or_declined(sentence: dict[str, Any], max_sentences: int) -> dict[str, Any]:
    """The reply's schema: 1 to ``max_sentences`` sentences of the ``sentence`` schema, or a refusal."""
    answered = {
        "type": "object",
        "properties": {"sentences": {"type": "array", "items": sentence, "minItems": 1, "maxItems": max_sentences}},
        "required": ["sentences"],
        "additionalProperties": False,
    }
    declined = {
        "type": "object",
        "properties": {"not_answerable": {"type": "boolean", "const": True}},
        "required": ["not_answerable"],
        "additionalProperties": False,
    }
    return {"anyOf": [answered, declined]}


def _parse(raw: str, partial: bool) -> Any:
    """``raw`` as JSON (``partial``: an incomplete document's complete part, strings cut where they end)."""
    try:
        return jiter.from_json(raw.encode(), partial_mode="trailing-strings" if partial else "off")
    except ValueError:
        return None


def _sentences(doc: Any) -> list[dict[str, Any]]:
    found = doc.get("sentences") if isinstance(doc, dict) else None
    return [s for s in found if isinstance(s, dict)] if isinstance(found, list) else []


def _text_of(sentence: dict[str, Any]) -> str:
    text = sentence.get("text")
    return MARKER.sub("", text).replace("\n", " ") if isinstance(text, str) else ""


def _numbers_of(sentence: dict[str, Any]) -> list[int]:
    found = sentence.get("sources")
    if not isinstance(found, list):
        return []
    return list(dict.fromkeys(n for n in found if isinstance(n, int) and not isinstance(n, bool)))


class StructuredScanner:
    """Turns a JSON answer, as it streams, into text with ``[n]`` markers and citations.

    Same interface as :class:`~generation.citations.CitationScanner` (``feed``, ``finish``,
    ``text``, ``citations``, ``dropped``), but :meth:`feed` returns the text to send as well:
    the rendered answer grows by those pieces only, so the concatenated deltas are ``text``.

    Args:
        sources: The sources that were sent, numbered from 1.
        language: The collection's analysis language (for ``supported``).
        threshold: Support score at or above which a citation is ``supported``.
        json: ``False``: the reply is free text from the start (no schema was asked for).

    Attributes:
        raw: The reply as the model wrote it (JSON, or free text when it was not).
        format: ``"json"``, or ``"text"`` once the reply showed it is not JSON.
        abstained: The model said the sources do not answer (``not_answerable`` and no sentence).
    """

    def __init__(
        self, sources: Sequence[SourceRef], language: Language, threshold: float, *, json: bool = True
    ) -> None:
        self._sources = {s.number: s for s in sources}
        self._language = language
        self._threshold = threshold
        self._free = CitationScanner(sources, language, threshold)
        self.raw = ""
        self.format: str | None = None if json else "text"
        self.text = ""
        self.citations: list[Citation] = []
        self.dropped = 0
        self.abstained = False
        self._done = 0  # sentences rendered whole
        self._shown = ""  # text of the sentence being streamed, as sent so far

    def feed(self, delta: str) -> tuple[str, list[Citation]]:
        """Add ``delta`` of the reply; the text to send and the citations completed by it."""
        self.raw += delta
        if self.format is None:
            head = self.raw.lstrip()
            if not head:
                return "", []
            self.format = "json" if head.startswith("{") else "text"
            if self.format == "text":
                return self._free_feed(self.raw)
        if self.format == "text":
            return self._free_feed(delta)
        sentences = _sentences(_parse(self.raw, partial=True))
        return self._render(sentences, final=False)

    def finish(self) -> tuple[str, list[Citation]]:
        """The reply is complete: what is left to send, and the last citations."""
        if self.format != "json":
            out, cites = "", list(self._free.finish())
            self._sync_free()
            return out, cites
        doc = _parse(self.raw, partial=False)
        complete = doc is not None
        if not complete:
            doc = _parse(self.raw, partial=True)
        sentences = _sentences(doc)
        if not complete and sentences and not _numbers_of(sentences[-1]):
            sentences = sentences[:-1]  # cut off (max_tokens) before its sources: nothing to cite it with
        text, cites = self._render(sentences, final=True)
        if not self.text and isinstance(doc, dict) and doc.get("not_answerable") is True:
            self.abstained = True
            self.text = text = NOT_ANSWERED
        return text, cites

    # --- rendering ----------------------------------------------------------------------
    def _render(self, sentences: list[dict[str, Any]], *, final: bool) -> tuple[str, list[Citation]]:
        start = len(self.text)
        cites: list[Citation] = []
        # a sentence is complete when the next one has begun, or the reply has ended
        complete = len(sentences) if final else max(len(sentences) - 1, 0)
        while self._done < complete:
            sentence = sentences[self._done]
            cites += self._close(_text_of(sentence), _numbers_of(sentence))
            self._done += 1
            self._shown = ""
        if not final and self._done < len(sentences):  # the sentence being written: its text so far
            body = _CLOSING.sub("", _text_of(sentences[self._done]))  # its punctuation waits for the markers
            if body.startswith(self._shown) and len(body) > len(self._shown):
                self.text += (" " if not self._shown and self.text else "") + body[len(self._shown) :]
                self._shown = body
        self.citations += cites
        return self.text[start:], cites

    def _close(self, text: str, numbers: list[int]) -> list[Citation]:
        """Send the rest of one complete sentence: its text not yet sent, its markers, its punctuation."""
        body = _CLOSING.sub("", text)
        if not body:
            return []
        tail = text[len(body) :].strip() or ("。" if re.search("[\u4e00-\u9fff]$", body) else ".")
        if not self._shown:
            self.text += " " if self.text else ""
            self.text += body
        elif body.startswith(self._shown):
            self.text += body[len(self._shown) :]
        else:  # the parse revised what was shown (a split escape): keep what was sent, end it here
            body = self._shown
        valid = [n for n in numbers if n in self._sources]
        self.dropped += len(numbers) - len(valid)
        cites: list[Citation] = []
        if valid:
            marker = "[" + ", ".join(str(n) for n in valid) + "]"
            self.text += " "
            start = len(self.text)
            self.text += marker
            for n in valid:
                source = self._sources[n]
                chunk = f"{source.title}\n{source.text}" if source.title else source.text
                got = check(body, chunk, self._language, self._threshold)
                cites.append(Citation(
                    n, marker, start, start + len(marker), source.document_id, source.chunk_id, source.title,
                    got.quote, got.score, got.supported, got.reason,
                ))
        self.text += tail
        return cites

    def _free_feed(self, delta: str) -> tuple[str, list[Citation]]:
        cites = self._free.feed(delta)
        self._sync_free()
        return delta, cites

    def _sync_free(self) -> None:
        self.text, self.citations, self.dropped = self._free.text, self._free.citations, self._free.dropped
