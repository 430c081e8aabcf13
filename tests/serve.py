"""``quarry serve`` in a child process, ready when ``/readyz`` answers 200: the one harness of tests and bench/.

    with QuarryServer(env, log=tmp_path / "serve.log").wait_ready() as server:
        httpx.post(f"{server.url}/v1/collections", json={"name": "docs"})

The child runs ``python -m quarry.cli serve --host 127.0.0.1 --port <free port> *args`` in a
session of its own (``stop``/``kill`` signal its whole process group: uvicorn's workers and a
Milvus Lite server with it). Its stdout and stderr go to a file, never a pipe: a pipe nobody reads
fills (64 KiB of access-log lines) and then blocks the server in its logging. Which code it runs is
the caller's ``env`` (``PYTHONPATH``) and ``cwd``: ``python -m`` puts ``cwd`` first on
``sys.path``. bench/ imports this module too (it puts the repository on ``sys.path``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx

__all__ = ["QuarryServer", "ServerNotReady", "free_port"]

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class ServerNotReady(RuntimeError):
    """The server exited, or did not answer ``/readyz`` with 200 in time; the message ends with its log's tail."""


class QuarryServer:
    """A ``quarry serve`` child process on a free loopback port (started on construction).

    Args:
        env: the child's whole environment (settings as ``QUARRY_*``; ``PYTHONPATH`` picks the code).
        args: more ``quarry serve`` arguments, e.g. ``["--workers", "2"]``.
        log: the file the child's output goes to (appended); default: a temporary file, removed by ``stop``.
        cwd: the child's working directory (first on its ``sys.path``); default: this process's.
    """

    def __init__(self, env: Mapping[str, str], *, args: Sequence[str] = (), log: Path | None = None,
                 cwd: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self._own_log = log is None
        if log is None:
            fd, name = tempfile.mkstemp(prefix="quarry-serve-", suffix=".log")
            os.close(fd)
            log = Path(name)
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as sink:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(  # noqa: S603 - our own CLI
                [sys.executable, "-m", "quarry.cli", "serve", "--host", HOST, "--port", str(self.port), *args],
                env=dict(env), cwd=cwd, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait_ready(self, timeout_s: float = 300.0, poll_s: float = 0.5) -> QuarryServer:
        """Poll ``GET /readyz`` until it answers 200; returns ``self``.

        Raises:
            ServerNotReady: the child exited first, or ``timeout_s`` passed; either way its
                process group has then been stopped.
        """
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.url, timeout=5) as client:
            while True:
                if self.proc.poll() is not None:
                    tail = self.tail()
                    self.stop()  # what it started (a Milvus Lite server) may live on in its group
                    raise ServerNotReady(f"quarry serve exited ({self.proc.returncode}):\n{tail}")
                try:
                    if client.get("/readyz").status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    tail = self.tail()
                    self.stop()
                    raise ServerNotReady(f"quarry serve not ready in {timeout_s:g} s:\n{tail}")
                time.sleep(poll_s)

    def output(self) -> str:
        """What the child has written so far (stdout and stderr)."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, chars: int = 3000) -> str:
        """The last ``chars`` characters of :meth:`output`."""
        return self.output()[-chars:]

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM to the child's process group; SIGKILL after ``timeout_s``. Returns its exit code."""
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait()
        return self._done()

    def kill(self) -> int | None:
        """SIGKILL to the child's process group (a machine that dies). Returns its exit code."""
        self._signal(signal.SIGKILL)
        self.proc.wait()
        return self._done()

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:  # the whole group is gone already
            pass

    def _done(self) -> int | None:
        if self._own_log:
            self.log.unlink(missing_ok=True)
        return self.proc.returncode

    def __enter__(self) -> QuarryServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
