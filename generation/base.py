"""The ``Generator`` seam: stream a chat completion's text from an LLM server, within deadlines.

Messages are OpenAI chat messages (``[{"role": "system" | "user" | "assistant", "content": str}]``).
A backend owns its connection, its deadlines and its circuit breaker; callers see text pieces
(:class:`Piece`) and the errors of :mod:`quarry.errors`' ``GenerationError`` branch.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

Message = dict[str, str]


@dataclass(frozen=True)
class GenerationParams:
    """What a request asks of the LLM.

    Attributes:
        max_tokens: Cap on the completion's length, in tokens.
        temperature: Sampling temperature (0: greedy).
        seed: Sampling seed, where the server honours one.
        stop: Sequences at which the server stops generating (OpenAI's ``stop``; empty: none).
        response_format: OpenAI's ``response_format`` (``{"type": "json_object"}``, a
            ``json_schema``...), passed to the server as given (``None``: not sent).
        schema: A JSON schema the reply must follow (sent as OpenAI's ``response_format``, in
            the form the server accepts: :data:`StructuredMode`); ``None``: free text.
    """

    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    response_format: Mapping[str, Any] | None = None
    schema: Mapping[str, Any] | None = None


StructuredMode = Literal["auto", "json_schema", "json_object", "off"]
"""How a JSON schema is asked of the server: ``json_schema`` (OpenAI, vLLM: ``{"type":
"json_schema", "json_schema": {"name", "schema", "strict"}}``), ``json_object`` (llama.cpp,
llama-cpp-python: ``{"type": "json_object", "schema": ...}``), ``off`` (free text), ``auto``
(the first of these the server accepts, found on the first structured request)."""


@dataclass(frozen=True)
class Usage:
    """Tokens of one completion, as the server reported them (``None``: not reported)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass(frozen=True)
class Piece:
    """One step of a stream: text (maybe empty), then, last, the finish reason and usage."""

    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None


@runtime_checkable
class Generator(Protocol):
    """Contract of an LLM backend.

    Attributes:
        model_id: The model the server is asked for (``None`` until known).
        tokenizer: ``"server"`` when :meth:`count_tokens` uses the model's own tokenizer,
            ``"approx"`` when it estimates.
    """

    model_id: str | None

    @property
    def structured(self) -> StructuredMode:
        """How a schema is sent: ``auto`` until the server's support is known, then the form it takes."""
        ...

    @property
    def tokenizer(self) -> str:
        """``"server"`` or ``"approx"`` (see the class)."""
        ...

    def stream(self, messages: Sequence[Message], params: GenerationParams) -> AsyncGenerator[Piece, None]:
        """The completion's text as it is generated; the last piece has its finish reason.

        Closing the iterator (or cancelling its consumer) aborts the upstream request.

        Raises:
            GenerationUnavailable: The server is down, answered 5xx, or is being skipped after an
                outage (``retry_after_s`` says for how long).
            GenerationTimeout: No connection, no first token, a stall or the total past its deadline.
            GenerationError: The server refused the request (4xx) or sent a malformed frame.
        """
        ...

    async def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text, in the model's tokenizer where known (no special tokens).

        ``count_tokens([])`` prepares the counter (and :meth:`estimate_tokens`) without counting.

        Raises:
            GenerationUnavailable: The server could not be asked.
        """
        ...

    def estimate_tokens(self, text: str) -> int:
        """Tokens of ``text`` estimated locally, without I/O (for choosing and cutting chunks)."""
        ...

    async def aclose(self) -> None:
        """Release the connection pool."""
        ...
