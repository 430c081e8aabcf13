"""An OpenAI-compatible chat-completions server (vLLM, llama.cpp, OpenAI) through the official client.

Why the ``openai`` package (3.x, on httpx2) rather than bare httpx: it is the client these servers test against,
it decodes their SSE frames into typed chunks and their error bodies into typed exceptions, and
it runs on an httpx client we own (one connection pool, also used for the tokenizer endpoints).
Its own retries are off: the circuit breaker and the answer path's degradation decide instead.

Deadlines (seconds, :class:`~quarry.settings.LLMSettings`): ``connect`` (TCP/TLS), ``first token``
(from the request to the first non-empty text delta: role-only or empty frames do not count),
``stall`` (between two text deltas) and ``total``. Each is enforced with an asyncio deadline
around the wait for the next frame, so a server that holds the connection open and says nothing
is cut off on time; cancelling the consumer closes the HTTP response, which closes the connection
and so aborts the request upstream (vLLM and llama.cpp stop generating for a closed connection).

Token counting (for the prompt's context budget) uses the server's own tokenizer where it has
one: llama-cpp-python's ``POST /extras/tokenize``, llama.cpp's and vLLM's ``POST /tokenize``;
otherwise :func:`approx_tokens`. Finding the endpoint (the first count, or ``count_tokens([])``)
also calibrates :meth:`estimate_tokens`, the local estimate the prompt chooses and cuts chunks
with: characters per token of :data:`CALIBRATION_TEXT` on this server, times
:data:`CALIBRATION_MARGIN`, then fixed, so the same request builds the same prompt. A prompt
costs one tokenizer round trip (more only when the estimate fell short).

Structured replies (``params.schema``): the schema goes in ``response_format`` in the form of
``QUARRY_LLM__STRUCTURED`` (:data:`generation.base.StructuredMode`). With ``auto``, the first
structured request tries ``json_schema``, then ``json_object`` with the schema, then free text,
stepping down when the server refuses the form before streaming (a 400, 404, 415, 422, 500 or
501 to the request: llama-cpp-python answers 500 to ``json_schema``), and keeps the first it
accepts; a refusal on the way is not an outage (the breaker does not count it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import anyio
import httpx2 as httpx  # openai 3's transport (the httpx API under a new name)
import openai

from generation.base import GenerationParams, Message, Piece, StructuredMode, Usage
from generation.prompt import CHARS_PER_TOKEN, approx_tokens
from quarry.breaker import OutageBreaker
from quarry.errors import (
    ConfigError,
    GenerationError,
    GenerationTimeout,
    GenerationUnavailable,
)
from quarry.settings import LLMSettings

CALIBRATION_MARGIN = 0.93
CALIBRATION_TEXT = (  # counted once when the tokenizer is found, so the first prompt is estimated well
    "Vitamin C deficiency causes scurvy, a disease marked by bleeding gums, poor wound healing and "
    "fatigue. In a randomized controlled trial of 1,204 adults, daily supplementation reduced the "
    "incidence of respiratory infections by 8% (95% CI 3-13%), although the effect on the duration "
    "of symptoms was not statistically significant. The authors conclude that further studies are "
    "needed before recommending routine supplementation to the general population."
)  # estimate a little more tokens than measured, so the first count usually fits


def parse_url(url: str) -> tuple[str, str | None]:
    """``openai+http://host:port/v1?model=NAME`` -> (``http://host:port/v1``, ``NAME`` or ``None``).

    Raises:
        ConfigError: Not an ``openai+http(s)://`` URL, or no host.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("openai+http", "openai+https") or not parts.hostname:
        raise ConfigError(f"LLM URL {url!r}: expected openai+http://host:port/v1?model=NAME (or openai+https://)")
    model = parse_qs(parts.query).get("model", [None])[0]
    base = urlunsplit((parts.scheme.removeprefix("openai+"), parts.netloc, parts.path.rstrip("/") or "/v1", "", ""))
    return base, model


class OpenAICompatGenerator:
    """Chat completions from an OpenAI-compatible server, streamed within deadlines, behind a breaker.

    Args:
        url: ``openai+http(s)://host:port/v1?model=NAME``.
        settings: Deadlines, breaker window and API key.

    Raises:
        ConfigError: Bad URL, or the ``openai`` package is missing (extra ``llm``).
    """

    def __init__(self, url: str, settings: LLMSettings) -> None:
        self._openai = openai
        self.base_url, self.model_id = parse_url(url)
        self._settings = settings
        read = max(settings.first_token_timeout_s, settings.stall_timeout_s)
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.total_timeout_s, connect=settings.connect_timeout_s, read=read)
        )
        self._client = openai.AsyncOpenAI(
            base_url=self.base_url, api_key=settings.api_key or "none", max_retries=0, http_client=self._http
        )
        self._breaker: OutageBreaker[GenerationUnavailable] = OutageBreaker(
            GenerationUnavailable, settings.retry_after_s
        )
        self._tokenize: str | None = None  # "llama-cpp-python" | "tokenize" | "approx"; None: not probed
        self._special = 0  # tokens the tokenizer endpoint adds to every text
        self._chars_per_token = CHARS_PER_TOKEN  # calibrated once the server's tokenizer is found
        self._structured: StructuredMode = settings.structured

    @property
    def structured(self) -> StructuredMode:
        """How a schema is sent (``auto``: not known yet; see the module docstring)."""
        return self._structured

    @property
    def tokenizer(self) -> str:
        """``"server"`` once the server's tokenizer answered, else ``"approx"``."""
        return "server" if self._tokenize in ("llama-cpp-python", "tokenize") else "approx"

    @property
    def outage(self) -> GenerationUnavailable | None:
        """The error that keeps the server skipped, while it lasts."""
        return self._breaker.outage

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def probe(self, timeout_s: float = 1.0) -> GenerationUnavailable | None:
        """Whether the server answers now (``/readyz``): ``None``, or why not.

        The breaker's outage while it lasts, else one ``GET {base}/models`` within ``timeout_s``
        (any HTTP answer but a 5xx counts as up).
        """
        if self.outage is not None:
            return self.outage
        headers = {"Authorization": f"Bearer {self._settings.api_key}"} if self._settings.api_key else {}
        try:
            async with asyncio.timeout(timeout_s):
                reply = await self._http.get(f"{self.base_url.rstrip('/')}/models", headers=headers)
        except TimeoutError:
            return GenerationUnavailable(f"LLM server {self.base_url} did not answer within {timeout_s:g} s")
        except httpx.HTTPError as exc:
            return GenerationUnavailable(f"LLM server {self.base_url} is unreachable ({type(exc).__name__})")
        if reply.status_code >= 500:
            return GenerationUnavailable(f"LLM server {self.base_url} answered HTTP {reply.status_code}")
        return None

    # --- generation ----------------------------------------------------------------------
    async def stream(self, messages: Sequence[Message], params: GenerationParams) -> AsyncGenerator[Piece, None]:
        """See :meth:`generation.base.Generator.stream`."""
        skip = self._breaker.check()
        if skip is not None:
            raise skip
        error: BaseException | None = None
        try:
            async for piece in self._stream(messages, params):
                yield piece
        except GenerationError as exc:
            error = exc
            raise
        finally:
            self._breaker.record(error)

    async def _stream(self, messages: Sequence[Message], params: GenerationParams) -> AsyncGenerator[Piece, None]:
        cfg = self._settings
        loop = asyncio.get_running_loop()
        started = loop.time()
        total_at = started + cfg.total_timeout_s
        first_at = min(started + cfg.first_token_timeout_s, total_at)
        model = await self._model()
        extra: dict[str, Any] = {"seed": params.seed} if params.seed is not None else {}
        if params.stop:
            extra["stop"] = list(params.stop)
        if params.response_format is not None:
            extra["response_format"] = dict(params.response_format)
        try:
            async with asyncio.timeout_at(first_at):
                stream = await self._open(model, messages, params, extra)
        except TimeoutError as exc:
            raise self._late("first token", cfg.first_token_timeout_s, loop.time() - started) from exc
        except self._openai.OpenAIError as exc:
            raise self._error(exc) from exc
        try:
            frames = stream.__aiter__()
            got_text = False
            while True:
                at = first_at if not got_text else min(loop.time() + cfg.stall_timeout_s, total_at)
                try:
                    async with asyncio.timeout_at(at):
                        chunk = await frames.__anext__()
                except StopAsyncIteration:
                    return
                except TimeoutError as exc:
                    if at == total_at:
                        raise self._late("total", cfg.total_timeout_s, loop.time() - started) from exc
                    if got_text:
                        raise self._late("stall", cfg.stall_timeout_s, cfg.stall_timeout_s) from exc
                    raise self._late("first token", cfg.first_token_timeout_s, loop.time() - started) from exc
                except (self._openai.OpenAIError, httpx.HTTPError, ValueError) as exc:
                    raise self._error(exc) from exc
                piece = _piece(chunk)
                got_text = got_text or bool(piece.text)
                yield piece
        finally:
            with anyio.CancelScope(shield=True):  # close the response even while being cancelled
                await stream.close()

    async def _open(
        self, model: str, messages: Sequence[Message], params: GenerationParams, extra: dict[str, Any]
    ) -> Any:
        """The streamed completion, its ``response_format`` the first form the server takes (see the module)."""
        forms: list[StructuredMode] = ["off"]
        if params.schema is not None and params.response_format is None and self._structured != "off":
            forms = ["json_schema", "json_object", "off"] if self._structured == "auto" else [self._structured]
        for i, form in enumerate(forms):
            try:
                stream = await self._client.chat.completions.create(
                    model=model, messages=list(messages), stream=True,  # type: ignore[call-overload]
                    max_tokens=params.max_tokens, temperature=params.temperature,
                    stream_options={"include_usage": True}, **extra, **_response_format(form, params.schema),
                )
            except self._openai.APIStatusError as exc:
                if i + 1 < len(forms) and exc.status_code in _FORM_REFUSED:
                    continue  # auto: the server does not take this form; try the next
                raise
            if self._structured == "auto" and params.schema is not None:
                self._structured = form
            return stream
        raise AssertionError("unreachable: the last form returns or raises")

    async def _model(self) -> str:
        """The model to ask for: the URL's ``model=``, else the server's first listed model."""
        if self.model_id is None:
            try:
                async with asyncio.timeout(self._settings.connect_timeout_s + self._settings.stall_timeout_s):
                    models = await self._client.models.list()
            except TimeoutError as exc:
                raise self._late("first token", self._settings.first_token_timeout_s, None) from exc
            except self._openai.OpenAIError as exc:
                raise self._error(exc) from exc
            if not models.data:
                raise GenerationError(f"LLM server {self.base_url} lists no model; add ?model=NAME to the URL")
            self.model_id = models.data[0].id
        return self.model_id

    @property
    def _retry_after_s(self) -> float:
        """The ``Retry-After`` hint of an outage: the breaker's window, at least 1 s."""
        return max(self._settings.retry_after_s, 1.0)

    def _late(self, which: str, limit_s: float, waited_s: float | None) -> GenerationTimeout:
        took = "" if waited_s is None else f" (waited {waited_s:.1f} s)"
        return GenerationTimeout(
            f"LLM server {self.base_url} missed its {which} deadline of {limit_s:g} s{took}",
            retry_after_s=self._retry_after_s,
        )

    def _error(self, exc: BaseException) -> GenerationError:
        """One of the client's or the transport's errors as a :class:`GenerationError`."""
        openai = self._openai
        where = f"LLM server {self.base_url}"
        after = self._retry_after_s
        if isinstance(exc, openai.APITimeoutError | httpx.TimeoutException):
            return GenerationTimeout(f"{where} timed out: {exc}", retry_after_s=after)
        if isinstance(exc, openai.APIConnectionError | httpx.TransportError):
            cause = exc.__cause__ or exc
            return GenerationUnavailable(f"{where} cannot be reached: {cause}", retry_after_s=after)
        if isinstance(exc, openai.APIStatusError):
            if exc.status_code >= 500 or exc.status_code == 429:
                return GenerationUnavailable(f"{where} answered {exc.status_code}: {exc.message}", retry_after_s=after)
            return GenerationError(f"{where} refused the request ({exc.status_code}): {exc.message}")
        return GenerationError(f"{where} sent a malformed reply: {type(exc).__name__}: {exc}")

    # --- tokens --------------------------------------------------------------------------
    def estimate_tokens(self, text: str) -> int:
        """See :meth:`generation.base.Generator.estimate_tokens` (calibrated on this server's tokenizer)."""
        return approx_tokens(text, self._chars_per_token)

    def _calibrate(self, text: str, tokens: int) -> None:
        """Set the characters-per-token estimate from one server count (once, when the tokenizer is found).

        Fixed for the process from then on, so the same request always builds the same prompt
        (a stream and a plain answer read the same sources).
        """
        if tokens > 0:
            self._chars_per_token = min(max(len(text) / tokens * CALIBRATION_MARGIN, 1.0), 8.0)

    async def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """See :meth:`generation.base.Generator.count_tokens`; approximated while the server is skipped.

        ``count_tokens([])`` asks nothing once the tokenizer is known; before, it finds it (and
        calibrates :meth:`estimate_tokens`).
        """
        if self._tokenize == "approx" or self._breaker.outage is not None:
            return [approx_tokens(t) for t in texts]
        if self._tokenize is None:
            await self._probe_tokenizer()
            if self._tokenize in ("approx", None):
                return [approx_tokens(t) for t in texts]
        try:
            return list(await asyncio.gather(*(self._count(t) for t in texts)))
        except (httpx.HTTPError, KeyError, ValueError):
            return [approx_tokens(t) for t in texts]

    async def _probe_tokenizer(self) -> None:
        """Find the server's tokenizer endpoint; ``approx`` when it has none (404/405/4xx)."""
        for kind in ("llama-cpp-python", "tokenize"):
            self._tokenize = kind
            try:
                self._special = 0
                self._special = await self._count("")  # what the endpoint adds to any text (BOS)
                self._calibrate(CALIBRATION_TEXT, await self._count(CALIBRATION_TEXT))
                return
            except httpx.HTTPStatusError as exc:
                if 400 <= exc.response.status_code < 500:
                    continue
            except (httpx.HTTPError, KeyError, ValueError, TypeError):
                pass
            self._tokenize = None  # the server could not be asked now: a later request probes again
            return
        self._tokenize = "approx"

    async def _count(self, text: str) -> int:
        root = self.base_url.removesuffix("/v1")
        timeout = self._settings.connect_timeout_s + self._settings.stall_timeout_s
        if self._tokenize == "llama-cpp-python":
            # llama-cpp-python tokenizes with add_bos=True; the probe measured that offset
            r = await self._http.post(f"{root}/extras/tokenize", json={"input": text}, timeout=timeout)
        else:
            body: dict[str, Any] = {"content": text, "prompt": text, "add_special": False, "add_special_tokens": False}
            if self.model_id:
                body["model"] = self.model_id
            r = await self._http.post(f"{root}/tokenize", json=body, timeout=timeout)
        r.raise_for_status()
        return max(0, len(r.json()["tokens"]) - self._special)


_FORM_REFUSED = frozenset({400, 404, 415, 422, 500, 501})


def _response_format(form: StructuredMode, schema: Any) -> dict[str, Any]:
    """The ``response_format`` argument of ``form`` for ``schema`` (none for ``off``)."""
    if schema is None or form in ("off", "auto"):
        return {}
    if form == "json_object":  # llama.cpp's grammar-constrained JSON
        return {"response_format": {"type": "json_object", "schema": dict(schema)}}
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": dict(schema),
                                                                         "strict": True}}}


def _piece(chunk: Any) -> Piece:
    """A streamed ``ChatCompletionChunk`` as a :class:`Piece`."""
    usage = None
    if getattr(chunk, "usage", None) is not None:
        usage = Usage(chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
    if not chunk.choices:
        return Piece(usage=usage)
    choice = chunk.choices[0]
    return Piece(text=choice.delta.content or "", finish_reason=choice.finish_reason, usage=usage)
