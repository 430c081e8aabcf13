"""Start a real server process for a test, wait until it is ready, stop it, find leftovers.

Every process the server starts (tritonserver, Python-backend stubs) inherits an environment
tag, so after the stop a scan of ``/proc/*/environ`` finds anything left running.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

TAG_VAR = "QUARRY_TEST_SERVER_TAG"


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that were free a moment ago."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - local test URL
            return int(response.status)
    except OSError as exc:
        return int(getattr(exc, "code", 0) or 0)


def environ(pid: int) -> dict[str, str] | None:
    """The environment ``pid`` started with; ``None`` if it is gone or not readable."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return dict(v.decode(errors="replace").partition("=")[::2] for v in raw.split(b"\0") if v)


def tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries ``tag`` (the server and everything it started)."""
    pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    return [pid for pid in pids if (environ(pid) or {}).get(TAG_VAR) == tag]


class ServerProcess:
    """A server started in its own session, with a log file and an environment tag."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.tag = uuid.uuid4().hex
        self.log = log
        self._log_fh = log.open("wb")
        self.proc = subprocess.Popen(
            cmd, env={**env, TAG_VAR: self.tag}, stdout=self._log_fh, stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def wait_ready(self, url: str, timeout_s: float) -> None:
        """Poll ``url`` until it answers 200; fail with the log if the process dies or time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            if http_status(url) == 200:
                return
            time.sleep(0.5)
        raise TimeoutError(f"{url} not ready after {timeout_s} s:\n{self.log_tail()}")

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 60) -> int:
        """Send ``sig`` to the server only (not its group) and wait for it to exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        finally:
            self._log_fh.close()

    def leftovers(self, grace_s: float = 10) -> list[int]:
        """Tagged processes still alive after up to ``grace_s`` seconds."""
        deadline = time.monotonic() + grace_s
        while (pids := tagged_pids(self.tag)) and time.monotonic() < deadline:
            time.sleep(0.25)
        return pids

    def kill_all(self) -> None:
        """Last resort after a failed test: kill every tagged process."""
        for pid in tagged_pids(self.tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)
