"""The one error root of Quarry and the tree under it.

Every error Quarry raises on purpose derives from :class:`QuarryError`. The REST layer maps
them to HTTP status codes in a single exception handler (``quarry.api.errors``); the CLI prints
their message. Driver errors are wrapped with ``raise ... from exc``, never swallowed.

::

    QuarryError
    ├── InvalidRequest                     400  the caller sent something we cannot use
    │   ├── InvalidQuery                   400  empty query, top_k out of range, bad mode
    │   ├── InvalidFilter                  400  unknown field, wrong type, bad operator
    │   ├── InvalidDocument                400  malformed input line or document (names the line)
    │   ├── DimensionMismatch              400  vector of the wrong dimension
    │   ├── UnsupportedIndex               400  index type/params the engine cannot build
    │   └── PayloadTooLarge                413  body or document over the server's limits
    ├── Unauthenticated                    401  no API key, or one unknown, malformed, expired or revoked
    ├── Forbidden                          403  the key lacks the scope or the collection
    ├── RateLimited                        429  the key's request rate is spent (retryable, Retry-After)
    ├── Overloaded                         503  shed: the server is saturated (retryable, Retry-After)
    ├── NotFound                           404
    │   └── CollectionNotFound             404
    ├── Conflict                           409
    │   ├── CollectionExists               409
    │   ├── ModelMismatch                  409  the collection's vectors come from another model
    │   │   └── ModelDimensionMismatch     409  ... of another dimension than the configured one
    │   ├── ReindexRunning                 409  another process holds the collection's reindex lease (retryable)
    │   └── ReindexFailed                  409  a reindex's verification failed; the live version still serves
    ├── ConfigError                        500  bad settings, unknown URL scheme, missing extra
    ├── StoreError                         500  a vector store operation failed
    │   ├── StoreUnavailable               503  the store cannot be reached (retryable)
    │   │   ├── StoreTimeout               503  the store did not answer this call in time
    │   │   └── StateStoreUnavailable      503  the state of record (docstore) cannot be reached or missed its deadline
    │   └── IndexBuildFailed               500  a build failed or stalled; rolled back
    ├── EmbeddingError                     500
    │   └── EmbeddingUnavailable           503  the embedding server is down (retryable)
    │       └── EmbeddingTimeout           503  one request was not answered in time
    ├── RerankError                        500
    └── GenerationError                    502  the LLM server failed or refused the request
        ├── GenerationUnavailable          503  the LLM server is down or missed a deadline (retryable)
        │   └── GenerationTimeout          503  no first token, a stall between tokens, or past the total
        └── LLMNotConfigured               503  an answer was required but no LLM is configured

``retryable`` tells a caller whether the same request may succeed later;
``retry_after_s`` is a hint (seconds) where one is known.

A ``StoreError``'s ``message`` is Quarry's own words (what failed, on which engine); the
driver's or the server's text goes to ``detail``, which is logged and never sent to a client
(it can carry SQL, server paths, or the request's own values echoed back).

A ``StoreTimeout`` is one call's failure: a slow query (a huge filter) times out alone while
the store serves the others. The store's outage breaker (:mod:`quarry.breaker`) opens at once on
a ``StoreUnavailable``, but on timeouts only when several come in a row with no answer between
them (evidence about the store, not about a query). (A query vector's cost does not depend on the
request, its text being cut at the model's ``max_seq_length``: a late one is evidence about the
model's server, which is skipped at once.)
"""

from __future__ import annotations

ECHO_CHARS = 80  # the most of a client's value an error message quotes


def clip(value: object, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` cut to about ``limit`` characters with an ellipsis: a client's value echoed in a message.

    A message quotes what the client sent so the client can find it, never all of it: a 10 KB name
    echoed whole makes every error log and response that large.
    """
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


class QuarryError(Exception):
    """Root of every error Quarry raises on purpose.

    Attributes:
        message: Human-readable explanation of what was wrong.
        retryable: Whether repeating the same call may succeed.
        retry_after_s: Suggested wait before a retry, in seconds, when known.
    """

    retryable: bool = False

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class InvalidRequest(QuarryError):
    """The caller sent something Quarry cannot use."""


class UnsupportedParameter(InvalidRequest):
    """An OpenAI parameter Quarry's chat completions do not honour (``n > 1``, ``tools``, ``logprobs``...).

    Attributes:
        param: The body field at fault (OpenAI's ``error.param``).
        code: ``unsupported_parameter`` (OpenAI's ``error.code``).
    """

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.param = param
        self.code = "unsupported_parameter"


class InvalidQuery(InvalidRequest):
    """Empty query text, ``top_k``/``offset`` out of range, or an unknown mode."""


class InvalidFilter(InvalidRequest):
    """A metadata filter names an unknown field, has a wrong type or an unknown operator."""


class InvalidDocument(InvalidRequest):
    """An input document or line is malformed; nothing of its batch was written.

    Attributes:
        line: 1-based line number in the source file, when the input is line-oriented.
        source: The file the document came from, when known.
    """

    def __init__(self, message: str, *, line: int | None = None, source: str | None = None) -> None:
        where = []
        if source is not None:
            where.append(source)
        if line is not None:
            where.append(f"line {line}")
        prefix = f"{':'.join(where)}: " if where else ""
        super().__init__(prefix + message)
        self.line = line
        self.source = source


class DimensionMismatch(InvalidRequest):
    """A vector's dimension differs from the collection's."""

    def __init__(self, *, expected: int, got: int, collection: str | None = None) -> None:
        where = f" for collection {collection!r}" if collection else ""
        super().__init__(f"vector dimension {got} does not match the expected dimension {expected}{where}")
        self.expected = expected
        self.got = got


class UnsupportedIndex(InvalidRequest):
    """The engine cannot build the requested index type or parameters."""


class PayloadTooLarge(InvalidRequest):
    """The request body, or a document in it, is larger than the server accepts (HTTP 413)."""


class Unauthenticated(QuarryError):
    """No API key was sent, or the one sent is unknown, malformed, expired or revoked (HTTP 401).

    The message says which, never echoing the key.
    """

    headers = {"WWW-Authenticate": 'Bearer realm="quarry"'}

    def __init__(self, message: str, *, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason  # missing, malformed, unknown, invalid, revoked, expired (a bounded metric label)


class Forbidden(QuarryError):
    """The API key is valid but lacks the scope, or the collection, the request needs (HTTP 403)."""

    def __init__(self, message: str, *, reason: str = "scope") -> None:
        super().__init__(message)
        self.reason = reason  # scope, collection (a bounded metric label)


class RateLimited(QuarryError):
    """The API key's request rate is spent; retry after ``retry_after_s`` (HTTP 429)."""

    retryable = True


class Overloaded(QuarryError):
    """The server is saturated and shed this lower-priority request; retry after ``retry_after_s`` (HTTP 503)."""

    retryable = True


class NotFound(QuarryError):
    """A named resource does not exist."""


class CollectionNotFound(NotFound):
    """The named collection (or alias) does not exist."""

    def __init__(self, name: str) -> None:
        super().__init__(f"collection {clip(name)} does not exist")
        self.name = name


class Conflict(QuarryError):
    """The request conflicts with the current state."""


class ReindexRunning(Conflict):
    """A reindex of the collection is already running (its lease is held)."""

    retryable = True


class ReindexFailed(Conflict):
    """A reindex did not swap (its checks failed); the live version serves unchanged."""


class CollectionExists(Conflict):
    """A collection with this name already exists."""

    def __init__(self, name: str, existing: str | None = None) -> None:
        if existing is None or existing == name:
            super().__init__(f"collection {name!r} already exists")
        else:  # some engines (Milvus Lite) fold the case of collection names
            super().__init__(
                f"collection {existing!r} already exists; names that differ only in case are the same collection"
            )
        self.name = name


class ModelMismatch(Conflict):
    """The collection's vectors come from another embedding model than the configured one.

    Models are told apart by fingerprint (a digest of what they compute); the names are shown.
    """

    def __init__(
        self,
        collection: str,
        stored: str,
        current: str,
        *,
        stored_fingerprint: str | None = None,
        current_fingerprint: str | None = None,
    ) -> None:
        if stored == current and stored_fingerprint and current_fingerprint:
            message = (
                f"collection {collection!r} holds vectors of model {stored!r} (fingerprint "
                f"{_short(stored_fingerprint)}); this server's model is also named {current!r} but computes "
                f"other vectors (fingerprint {_short(current_fingerprint)}): a model saved under the same "
                "name is not the same model. Serve the model the collection was built with, or ingest into "
                "a new collection"
            )
        else:
            message = (
                f"collection {collection!r} holds vectors of model {stored!r}; this server embeds with "
                f"{current!r}, whose vectors are not comparable: set QUARRY_EMBEDDING__URL to {stored!r}, "
                "or ingest into a new collection"
            )
        super().__init__(message)
        self.collection, self.stored, self.current = collection, stored, current
        self.stored_fingerprint, self.current_fingerprint = stored_fingerprint, current_fingerprint


def _short(fingerprint: str) -> str:
    """A fingerprint cut for messages: kind and 12 hex digits."""
    head, _, digest = fingerprint.rpartition(":")
    return f"{head}:{digest[:12]}" if head else fingerprint[:12]


class ModelDimensionMismatch(ModelMismatch):
    """The configured model's vectors have another dimension than the collection's.

    A conflict of the collection with the server's model (409), not a bad request: hybrid search
    answers from BM25 alone and says why, as for any :class:`ModelMismatch`.

    Attributes:
        expected: The collection's dimension.
        got: The configured model's dimension.
    """

    def __init__(self, collection: str, model: str, *, expected: int, got: int) -> None:
        Conflict.__init__(
            self,
            f"collection {collection!r} holds {expected}-dimensional vectors; this server's model {model!r} "
            f"gives {got}-dimensional ones, which cannot be compared: set QUARRY_EMBEDDING__URL to the "
            "collection's model, or ingest into a new collection",
        )
        self.collection, self.stored, self.current = collection, model, model
        self.stored_fingerprint = self.current_fingerprint = None
        self.expected, self.got = expected, got


class ConfigError(QuarryError):
    """Settings are invalid: unknown URL scheme, missing optional extra, bad path."""


class StoreError(QuarryError):
    """A vector store operation failed.

    Attributes:
        detail: The driver's or the engine's own text (logged; never sent to a client), or ``None``.
    """

    def __init__(self, message: str, *, detail: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.detail = detail
        if detail:  # str(exc), for logs, tracebacks and the CLI: the message and the engine's words
            self.args = (f"{message}: {detail}",)


class StoreUnavailable(StoreError):
    """The vector store cannot be reached; the call may succeed later."""

    retryable = True


class StoreTimeout(StoreUnavailable):
    """The vector store did not answer one call within its deadline: that call's failure, not an outage."""


class StateStoreUnavailable(StoreUnavailable):
    """The state of record (the docstore: SQLite or PostgreSQL) cannot be reached, is busy, or missed a call's deadline.

    ``retry_after_s`` is set (``QUARRY_DOCSTORE__TIMEOUT_S`` at least 1 s): the REST layer sends it
    as ``Retry-After``.
    """


class IndexBuildFailed(StoreError):
    """An index build failed or stalled past its timeout; the partial index was dropped."""


class EmbeddingError(QuarryError):
    """The embedding model failed on a batch."""


class EmbeddingUnavailable(EmbeddingError):
    """The embedding server (e.g. Triton) cannot be reached or is not ready."""

    retryable = True


class EmbeddingTimeout(EmbeddingUnavailable):
    """The embedding server did not answer one request in time: that call's failure, not yet an outage."""


class RerankError(QuarryError):
    """The reranker failed."""


class GenerationError(QuarryError):
    """The LLM server answered with an error (a refusal, a bad request such as an over-long prompt)."""


class GenerationUnavailable(GenerationError):
    """The LLM server cannot be reached, failed (5xx) or is skipped after an outage."""

    retryable = True


class GenerationTimeout(GenerationUnavailable):
    """The LLM server missed a deadline: connect, first token, stall between tokens, or total."""


class LLMNotConfigured(GenerationError):
    """An answer was required (``require_answer``, ``quarry eval --answers``) but ``QUARRY_LLM__URL`` is empty."""


def missing_extra(module: str, extra: str) -> ConfigError:
    """Build the error raised when an optional dependency is not installed.

    Args:
        module: The import that failed, e.g. ``"qdrant_edge"``.
        extra: The ``quarry`` extra that provides it, e.g. ``"qdrant"``.

    Returns:
        A :class:`ConfigError` whose message names the package extra to install.
    """
    return ConfigError(
        f"the optional dependency {module!r} is not installed; "
        f"install it with: pip install 'quarry[{extra}]'"
    )


class EvaluationError(QuarryError):
    """An evaluation cannot measure what it was asked to (a query was answered in a degraded mode)."""
