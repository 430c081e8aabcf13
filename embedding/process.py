"""The query encoder in a child process: the model's CPU work out of the server's GIL.

In process, the REST server's model thread shares the GIL with the event loop and the vector
store's client thread. ONNX Runtime releases the GIL while it computes, but each call must take it
back, and on 2 busy cores that wait is long: the model thread ran 74% of the wall time, waited
6% for a core and slept ~19% on the GIL (per-thread ``schedstat``, ~2,700 sleeps per 10 s at
32 clients), so the model, the bottleneck, idled while requests queued for it.

:class:`ProcessEmbedder` runs the embedder of an ``onnx://`` or ``torch://`` URL in a child
process (``python -m embedding.process``: a fresh interpreter, so no thread or lock of the server
is forked and the caller's ``__main__`` is not re-imported, unlike ``multiprocessing``'s spawn)
and talks to it over a socket pair with ``multiprocessing.connection`` framing (pickle). The
child does the dynamic batching itself: it takes every request that arrived while it was busy
(up to ``max_batch`` texts) into one model call, as :class:`~embedding.batching.BatchingEmbedder`
does in process (Triton's ``dynamic_batching`` with a zero queue delay). In the server,
:meth:`submit` writes the texts to the socket and returns a future; one receiver thread reads
each batch's answer and completes its futures, taking the GIL once per batch. Measured on 2
cores, 32 clients, ONNX int8 ``threads=1``, two servers alternating 10 s runs: 291.6 vs 283.2
req/s (6 rounds) and 293.4 vs 282.6 (4 rounds), +3-4%; the child then computes 86% of the time;
1-client p50 unchanged (8.9-10.4 ms both).

Enabled by ``QUARRY_EMBEDDING__QUERY_PROCESS=true`` (the query path only: ingestion keeps its
in-process embedder and all cores). If the child dies, its requests in flight fail with
:class:`~quarry.errors.EmbeddingUnavailable` (hybrid search degrades to BM25, as when Triton is
down) and the next request starts a new child.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from embedding.base import Embeddings
from embedding.card import ModelCard
from quarry.errors import ConfigError, EmbeddingError, EmbeddingUnavailable
from quarry.settings import Settings

log = logging.getLogger(__name__)
SCHEMES = ("onnx", "torch")  # in-process models; a Triton client gains nothing from a process


class _Child:
    """One running child: its process, its socket, and the requests sent to it and not answered."""

    def __init__(self, process: subprocess.Popen[bytes], conn: Connection) -> None:
        self.process, self.conn = process, conn
        self.pending: dict[int, Future[Embeddings]] = {}
        self.lock = threading.Lock()  # pending
        self.send_lock = threading.Lock()

    def fail_pending(self, why: str) -> None:
        """Fail every request still waiting on this child (the one that pops a future completes it)."""
        with self.lock:
            futures, self.pending = list(self.pending.values()), {}
        for future in futures:
            future.set_exception(EmbeddingUnavailable(why))


class ProcessEmbedder:
    """An embedder URL served by a child process; same contract as ``BatchingEmbedder``.

    Args:
        url: ``onnx://...`` or ``torch://...`` (see :func:`embedding.factory.open_embedder`).
        settings: Passed to the child, which opens ``url`` with them.
        max_batch: Most texts the child puts in one model call (one larger request runs alone).
        start_timeout_s: Seconds to wait for the child to load the model (export on first use
            included) before :meth:`warm_up` gives up.

    Raises:
        ConfigError: ``url`` is not ``onnx://`` or ``torch://``.
    """

    def __init__(self, url: str, settings: Settings, *, max_batch: int = 64, start_timeout_s: float = 600.0) -> None:
        scheme = url.split("://", 1)[0].lower()
        if scheme not in SCHEMES:
            raise ConfigError(f"a query encoder process runs {' or '.join(SCHEMES)}:// models, got {url!r}")
        self._url, self._settings = url, settings
        self._max_batch = max_batch
        self._start_timeout_s = start_timeout_s
        self._lock = threading.Lock()  # starting and stopping children
        self._child: _Child | None = None
        self._closed = False
        self._ids = itertools.count()
        # created now, so that submit() never waits on _lock (held while a child loads)
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quarry-query-encoder-start")
        self.model_id = url
        self.fingerprint = ""  # the child's model's, once it is up
        self.dim = 0
        self.max_seq_length = 0
        self.card = ModelCard()  # the child's model's, once it is up

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        child = self._child
        return None if child is None else int(child.process.pid)

    def warm_up(self) -> None:
        """Start the child and wait until its model is loaded (idempotent).

        Raises:
            EmbeddingUnavailable: The child failed to load the model, exited, or did not answer
                within ``start_timeout_s`` (the child's error message is included); or
                :meth:`close` was called.
        """
        with self._lock:
            if self._closed:
                raise EmbeddingUnavailable("query encoder process was closed")
            if self._child is not None:
                return
            process, conn = _spawn()
            try:
                conn.send((self._url, self._settings, self._max_batch))
                if not conn.poll(self._start_timeout_s):
                    raise EmbeddingUnavailable(
                        f"query encoder process did not load {self._url} in {self._start_timeout_s:g} s"
                    )
                kind, *info = conn.recv()
            except (EOFError, OSError) as exc:
                kind, info = "failed", [f"exited with code {_reap(process)} ({exc!r})"]
            except EmbeddingUnavailable:
                _stop(process, conn)
                raise
            if kind != "ready":
                _stop(process, conn)
                raise EmbeddingUnavailable(f"query encoder process could not load {self._url}: {info[0]}")
            self.dim, self.max_seq_length, self.model_id, self.fingerprint, self.card = info
            child = self._child = _Child(process, conn)
            receiver = threading.Thread(target=self._receive, args=(child,), name="quarry-query-encoder-recv")
            receiver.daemon = True
            receiver.start()
            log.info("query encoder %s runs in process %s", self.model_id, process.pid)

    def submit(self, texts: Sequence[str]) -> Future[Embeddings]:
        """Queue query ``texts`` for the child's next model call (``embed_queries``) and return at once.

        Before the child is up (first use, or after it died) the start runs on a helper thread.

        Returns:
            A future of ``(len(texts), dim) float32`` L2-normalised rows; ``result()`` raises
            ``EmbeddingUnavailable`` (child down, unable to start, or closed) or
            ``EmbeddingError`` (the model failed on the batch, or the texts cannot be sent).
        """
        child = self._child
        if child is None:
            try:
                return self._starter.submit(self._start_and_embed, texts)
            except RuntimeError:  # the starter was shut down by close()
                return _failed(EmbeddingUnavailable("query encoder process was closed"))
        return self._send(child, texts)

    def embed_queries(self, texts: Sequence[str]) -> Embeddings:
        """:meth:`submit` and wait; see :meth:`embedding.base.Embedder.embed_queries`."""
        return self.submit(texts).result()

    def close(self) -> None:
        """Stop the child for good: requests in flight and later ones fail with ``EmbeddingUnavailable``."""
        self._starter.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._closed = True
            child, self._child = self._child, None
        if child is not None:
            with child.send_lock:
                _stop(child.process, child.conn)
            child.fail_pending("query encoder process was closed")

    def _start_and_embed(self, texts: Sequence[str]) -> Embeddings:
        self.warm_up()
        child = self._child
        if child is None:
            raise EmbeddingUnavailable("query encoder process stopped while starting")
        return self._send(child, texts).result()

    def _send(self, child: _Child, texts: Sequence[str]) -> Future[Embeddings]:
        future: Future[Embeddings] = Future()
        future.set_running_or_notify_cancel()  # see MicroBatcher.submit: callers may not cancel
        if len(texts) == 0:
            future.set_result(Embeddings(np.zeros((0, self.dim), np.float32), np.zeros(0, bool)))
            return future
        request = next(self._ids)
        with child.lock:
            child.pending[request] = future
        try:
            with child.send_lock:
                child.conn.send((request, list(texts)))
        except Exception as exc:  # noqa: BLE001 - unpicklable texts, or the child is gone
            with child.lock:
                mine = child.pending.pop(request, None) is not None
            if mine:  # else the receiver already failed it
                gone = isinstance(exc, OSError)
                error = EmbeddingUnavailable if gone else EmbeddingError
                what = "query encoder process is down" if gone else "cannot send these texts to the query encoder"
                future.set_exception(error(f"{what}: {exc}"))
        return future

    def _receive(self, child: _Child) -> None:
        """Complete the futures of ``child``'s answers until its socket closes."""
        try:
            while True:
                try:
                    answers = child.conn.recv()
                except (EOFError, OSError):
                    break
                with child.lock:
                    done = [(child.pending.pop(request, None), result) for request, result in answers]
                for future, result in done:
                    if future is None:
                        continue
                    if isinstance(result, str):
                        future.set_exception(EmbeddingError(f"query encoder failed on a batch: {result}"))
                    else:
                        future.set_result(Embeddings(*result))
        except Exception:  # a malformed answer: treat the child as dead rather than hang its callers
            log.exception("query encoder answer could not be read")
        with self._lock:
            died = self._child is child  # not closed: the next request starts a new child
            if died:
                self._child = None
        if died:
            _stop(child.process, child.conn)
            log.error("query encoder process exited (code %s); restarting on the next query", child.process.returncode)
        child.fail_pending("query encoder process exited")


def _failed(exc: BaseException) -> Future[Embeddings]:
    future: Future[Embeddings] = Future()
    future.set_exception(exc)
    return future


def _spawn() -> tuple[subprocess.Popen[bytes], Connection]:
    """Start ``python -P -m embedding.process FD`` with one end of a socket pair as FD.

    ``-P``: the working directory is not put on ``sys.path``, so a file named like one of our
    packages there cannot shadow it; the checkout comes first on ``PYTHONPATH``.
    """
    ours, theirs = socket.socketpair()
    root = str(Path(__file__).resolve().parents[1])  # the checkout, for a child run from elsewhere
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    with theirs:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-P", "-m", "embedding.process", str(theirs.fileno())], pass_fds=[theirs.fileno()], env=env
        )
    return process, Connection(ours.detach())


def _reap(process: subprocess.Popen[bytes]) -> int | None:
    """The exit code of a child whose socket closed (waits a moment for it to be reaped)."""
    try:
        return process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


def _stop(process: subprocess.Popen[bytes], conn: Connection) -> None:
    """Ask the child to exit (``None``), wait, terminate it if it will not, close the socket."""
    try:
        conn.send(None)
    except (OSError, ValueError):  # already gone
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
    finally:
        conn.close()


def _die_with_parent() -> None:
    """Exit when the server dies, even in the middle of a long model call.

    An idle child sees its socket close and exits; a busy one would finish its batch first. A
    watchdog thread polls the parent's pid (``PR_SET_PDEATHSIG`` would fire when the *thread*
    that started the child ends, e.g. an idle worker thread of the server's pool).
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="quarry-query-encoder-watchdog", daemon=True).start()


def _serve(conn: Connection) -> None:
    """The child: read ``(url, settings, max_batch)``, load the model, answer batches until stopped.

    Each message in is ``(request_id, texts)``, or ``None`` to stop; each message out is a list
    with, per request of the batch, ``(request_id, (vectors, truncated))`` or
    ``(request_id, error_message)``.
    """
    from embedding.factory import open_embedder

    _die_with_parent()
    try:
        url, settings, max_batch = conn.recv()
        embedder = open_embedder(url, settings)
        embedder.warm_up()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it typed
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", embedder.dim, embedder.max_seq_length, embedder.model_id, embedder.fingerprint, embedder.card))
    stop = False
    while not stop:
        batch: list[tuple[int, list[str]]] = []
        try:
            first = conn.recv()
            stop = first is None
            size = 0
            while first is not None:
                batch.append(first)
                size += len(first[1])
                if size >= max_batch or not conn.poll(0):
                    break
                first = conn.recv()  # everything that queued meanwhile
                stop = first is None
        except (EOFError, OSError):
            return
        if batch:
            conn.send(_answer(embedder, batch))


def _answer(embedder: Any, batch: list[tuple[int, list[str]]]) -> list[tuple[int, Any]]:
    try:
        result = embedder.embed_queries([text for _, texts in batch for text in texts])
    except Exception as exc:  # noqa: BLE001 - each request of the batch gets the message
        return [(request, f"{type(exc).__name__}: {exc}") for request, _ in batch]
    answers, start = [], 0
    for request, texts in batch:
        end = start + len(texts)
        answers.append((request, (result.vectors[start:end], result.truncated[start:end])))
        start = end
    return answers


if __name__ == "__main__":  # the child: python -m embedding.process FD
    _serve(Connection(int(sys.argv[1])))
