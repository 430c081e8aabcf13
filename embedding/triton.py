"""Embeddings from an NVIDIA Triton Inference Server (``triton+grpc://``, ``triton+http://``).

``triton+grpc://host:8001/minilm`` or ``triton+http://host:8000/minilm[/<version>]``, optional
query ``model_id=<name>`` (else the model config's ``model_id`` parameter, else the Triton model
name) and ``retries=<n>`` (attempts per call, default 3). The server side is either
``quarry triton serve`` (PyTriton, :mod:`embedding.triton_server`) or a stock ``tritonserver``
loading ``model_repository/``; both expose ``text`` -> ``embedding``, ``truncated``.

``warm_up`` checks that the server is live and the model ready, and reads the model config
(max batch size, output dimension). Calls are split into batches of at most the server's
``max_batch_size``. Transient failures (connection refused, ``UNAVAILABLE``, timeouts, HTTP
429/502/503/504) are retried with exponential backoff (tenacity); when the attempts run out the
call raises :class:`~quarry.errors.EmbeddingUnavailable` naming the URL. Each thread uses its own
client (tritonclient's clients are not thread-safe), so one embedder serves a thread pool.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import numpy as np
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from embedding.base import Embeddings
from embedding.card import CardOverrides, ModelCard, parse_languages
from embedding.fingerprint import spec_fingerprint
from embedding.triton_protocol import ModelSpec, Protocol, Wire
from quarry.errors import ConfigError, EmbeddingError, EmbeddingUnavailable

T = TypeVar("T")
_WIRES: dict[str, Wire] = {"triton+grpc": "grpc", "triton+http": "http"}


class _NotReady(Exception):
    """The server is live but the model is not (yet) ready; retried like a transient error."""


@dataclass(frozen=True)
class TritonTarget:
    """A parsed ``triton+grpc://`` / ``triton+http://`` URL.

    Attributes:
        wire: ``grpc`` or ``http``.
        address: ``host:port``.
        model: Triton model name.
        version: Model version (``""`` = the server's latest).
        model_id: ``model_id`` override from the query string, if any.
        attempts: Tries per call before :class:`EmbeddingUnavailable`.
    """

    wire: Wire
    address: str
    model: str
    version: str = ""
    model_id: str | None = None
    attempts: int = 3

    @property
    def url(self) -> str:
        """The URL without query, for messages."""
        version = f"/{self.version}" if self.version else ""
        return f"triton+{self.wire}://{self.address}/{self.model}{version}"


def parse_triton_url(url: str) -> TritonTarget:
    """Parse ``triton+grpc://host:port/<model>[/<version>][?model_id=..&retries=..]``.

    Raises:
        ConfigError: Wrong scheme, no host:port or a port outside 1-65535, credentials in the
            URL, no model, a version that is not a positive integer, or an unknown/invalid
            parameter.
    """
    usage = f"expected triton+grpc://host:port/<model>[/<version>] or triton+http://..., got {url!r}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # "Port out of range", "Invalid IPv6 URL", a port that is not a number
        raise ConfigError(f"{usage} ({exc})") from exc
    wire = _WIRES.get(parts.scheme.lower())
    path = [p for p in parts.path.split("/") if p]
    if wire is None or not parts.hostname or not port or not 1 <= len(path) <= 2:
        raise ConfigError(usage)
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            "credentials in a Triton URL are not supported (Triton's endpoints take no user:password, "
            "and the URL appears in messages); remove the user:password@ part"
        )
    version = path[1] if len(path) > 1 else ""
    if version and not _positive_int(version):
        raise ConfigError(f"the model version must be a positive integer, got {version!r} in {url!r}")
    params = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    if set(params) - {"model_id", "retries"}:
        raise ConfigError(f"unknown parameter(s) in {url!r}; known: model_id, retries")
    retries = params.get("retries", "3")
    if not _positive_int(retries):
        raise ConfigError(f"retries must be a positive integer in {url!r}")
    return TritonTarget(
        wire=wire, address=parts.netloc, model=path[0], version=version,
        model_id=params.get("model_id"), attempts=int(retries),
    )


def _positive_int(text: str) -> bool:
    """``text`` is a decimal integer >= 1 in ASCII digits (``str.isdigit`` also takes ``"²"``)."""
    return text.isascii() and text.isdigit() and int(text) >= 1


class TritonEmbedder:
    """Client of an embedding model served by Triton; safe to call from many threads.

    Args:
        target: Parsed URL.
        timeout_s: Connection and per-request timeout, in seconds.
        batch_size: Texts per request (capped at the server's ``max_batch_size``).
        backoff_s: First retry wait, in seconds; doubles each retry (capped at 2 s).
        card: The URL's ``languages``/``query_prefix``/``passage_prefix``, over what the model's
            config publishes as parameters of those names (:mod:`embedding.card`).
    """

    def __init__(
        self,
        target: TritonTarget,
        *,
        timeout_s: float = 30.0,
        batch_size: int = 64,
        backoff_s: float = 0.1,
        card: CardOverrides | None = None,
    ) -> None:
        self.target = target
        self._card_overrides = card or CardOverrides()
        self.card: ModelCard = self._card_overrides.over(ModelCard())
        self.model_id = target.model_id or target.model
        self.fingerprint = ""  # set by warm_up, from what the server reports
        self.dim = 0
        self.max_seq_length = 0
        self._protocol = Protocol(target.wire, target.address, timeout_s)
        self._batch_size = batch_size
        self._backoff_s = backoff_s
        self._spec: ModelSpec | None = None
        self._lock = threading.Lock()
        self._local = threading.local()
        self._clients: list[Any] = []
        self._clients_lock = threading.Lock()
        self._generation = 0

    @classmethod
    def from_url(
        cls, url: str, timeout_s: float = 30.0, batch_size: int = 64, card: CardOverrides | None = None
    ) -> TritonEmbedder:
        """Build from a ``triton+grpc://`` / ``triton+http://`` URL (nothing connects yet).

        Raises:
            ConfigError: Malformed URL.
        """
        return cls(parse_triton_url(url), timeout_s=timeout_s, batch_size=batch_size, card=card)

    def warm_up(self) -> None:
        """Check the server is live and the model ready; read its config. Idempotent.

        Raises:
            EmbeddingUnavailable: Server unreachable or model not ready after the retries.
            EmbeddingError: The model does not look like an embedding model (wrong inputs/outputs).
        """
        with self._lock:
            if self._spec is not None:
                return
            spec = self._call("checking the model", self._check)
            self.model_id = self.target.model_id or spec.parameters.get("model_id") or self.target.model
            self.card = self._card_overrides.over(published_card(spec.parameters))
            self.fingerprint = self.card.fold(served_fingerprint(self.target, spec))
            self.max_seq_length = int(spec.parameters.get("max_seq_length") or 0)
            self.dim = spec.dim
            self._spec = spec
            if not self.dim:  # variable output dims in the config: ask the model once
                self.dim = int(self._infer(["dimension probe"])[0].shape[1])

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """Embed document texts on the server: ``(n, dim) float32`` L2-normalised rows + truncation flags.

        Raises:
            EmbeddingUnavailable: Server down/unready after the retries (retryable).
            EmbeddingError: The server rejected the request.
        """
        self.warm_up()
        return self._embed(self.card.prefixed(texts, query=False))

    def embed_queries(self, texts: Sequence[str]) -> Embeddings:
        """Embed queries (the card's query prefix first); see :meth:`embed`."""
        self.warm_up()
        return self._embed(self.card.prefixed(texts, query=True))

    def _embed(self, texts: Sequence[str]) -> Embeddings:
        if not texts:
            return Embeddings(np.zeros((0, self.dim), np.float32), np.zeros(0, bool))
        assert self._spec is not None
        step = max(1, min(self._batch_size, self._spec.max_batch_size))
        parts = [self._infer(list(texts[i : i + step])) for i in range(0, len(texts), step)]
        vectors = np.vstack([p[0] for p in parts])
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = (vectors / np.clip(norms, 1e-12, None)).astype(np.float32, copy=False)
        return Embeddings(vectors, np.concatenate([p[1] for p in parts]))

    def _infer(self, texts: list[str]) -> tuple[Any, Any]:
        spec = self._spec
        assert spec is not None
        t = self.target
        return self._call(
            f"embedding {len(texts)} texts",
            lambda client: self._protocol.infer(client, t.model, t.version, spec, texts),
        )

    def close(self) -> None:
        """Close every client this embedder opened (threads open new ones on their next call)."""
        with self._clients_lock:
            clients, self._clients = self._clients, []
            self._generation += 1
        for client in clients:
            client.close()

    def _check(self, client: Any) -> ModelSpec:
        t, p = self.target, self._protocol
        if not p.is_live(client):
            raise _NotReady(f"server at {t.address} is not live")
        if not p.is_ready(client, t.model, t.version):
            version = f" version {t.version}" if t.version else ""
            raise _NotReady(f"model {t.model!r}{version} is not ready")
        try:
            return p.spec(client, t.model, t.version)
        except ValueError as exc:
            raise EmbeddingError(f"{t.url} is not an embedding model: {exc}") from exc

    def _client(self) -> Any:
        local = self._local
        if getattr(local, "generation", None) != self._generation:
            local.client = self._protocol.client()
            local.generation = self._generation
            with self._clients_lock:
                self._clients.append(local.client)
        return local.client

    def _transient(self, exc: BaseException) -> bool:
        if isinstance(exc, (_NotReady, *self._protocol.transient_errors)):
            return True
        return str(getattr(exc, "status", lambda: None)()) in self._protocol.transient_statuses

    def _call(self, what: str, fn: Callable[[Any], T]) -> T:
        retrying = Retrying(
            stop=stop_after_attempt(self.target.attempts),
            wait=wait_exponential(multiplier=self._backoff_s, min=self._backoff_s, max=2.0),
            retry=retry_if_exception(self._transient),
            reraise=True,
        )
        try:
            return retrying(lambda: fn(self._client()))
        except EmbeddingError:
            raise
        except BaseException as exc:  # tritonclient, grpc, gevent and socket errors
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            if self._transient(exc):
                raise EmbeddingUnavailable(
                    f"Triton at {self.target.url} is unavailable ({what}, {self.target.attempts} "
                    f"attempts): {_describe(exc)}",
                    retry_after_s=1.0,
                ) from exc
            raise EmbeddingError(f"Triton at {self.target.url} failed {what}: {_describe(exc)}") from exc


def published_card(parameters: dict[str, str]) -> ModelCard:
    """The card a model config publishes: parameters ``languages`` (``en,zh``), ``query_prefix``, ``passage_prefix``."""
    return ModelCard(
        languages=parse_languages(parameters.get("languages", ""), "the Triton model config"),
        query_prefix=parameters.get("query_prefix", ""),
        passage_prefix=parameters.get("passage_prefix", ""),
    )


def served_fingerprint(target: TritonTarget, spec: ModelSpec) -> str:
    """The served model's fingerprint, from what the server reports.

    The ``fingerprint`` parameter of its config when the server publishes one (``quarry triton
    serve`` publishes the model folder's, as ``torch://`` has it), else a digest of the model's
    name, the version asked for and its config.
    """
    published = spec.parameters.get("fingerprint")
    if published:
        return published
    return spec_fingerprint("triton", {"model": target.model, "version": target.version, "config": asdict(spec)})


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _NotReady):
        return str(exc)
    message = getattr(exc, "message", None)
    text = message() if callable(message) else str(exc)
    return f"{type(exc).__name__}: {text or repr(exc)}"
