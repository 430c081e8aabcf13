"""A scripted server speaking OpenAI's chat-completions wire format (JSON and SSE), for replies a
real model will not produce on demand: out-of-range markers, never starting, stalling, malformed
frames. It runs on its own event loop in a thread, one raw HTTP/1.1 exchange per connection, and
records when a client closes a connection it was still holding (the upstream side of a cancel).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reply:
    """What the next chat completion gets.

    Attributes:
        pieces: Content deltas, each its own SSE frame (or joined for a JSON reply).
        hold_before_headers: Send nothing at all, ever (a server that never starts).
        stall_after: After this many pieces, send nothing more until the client leaves.
        gap_s: Pause before each piece, in seconds.
        status: HTTP status; not 200: an OpenAI error body.
        raw: Frames sent as they are (malformed ones), instead of ``pieces``.
    """

    pieces: list[str] = field(default_factory=lambda: ["ok"])
    hold_before_headers: bool = False
    stall_after: int | None = None
    gap_s: float = 0.0
    status: int = 200
    raw: list[bytes] | None = None


class StubLLM:
    """Start with :meth:`start`; queue replies in :attr:`replies`; ``closed`` records client closes."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[dict[str, Any]] = []
        self.closed: list[float] = []  # monotonic times a client closed a held connection
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"openai+http://127.0.0.1:{self.port}/v1?model=stub"

    def start(self) -> StubLLM:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            body = await reader.readexactly(int(headers.get("content-length", 0)))
            if method == "GET" and path.endswith("/models"):
                await self._json(writer, 200, {"object": "list", "data": [{"id": "stub", "object": "model",
                                                                             "created": 0, "owned_by": "stub"}]})
            elif method == "POST" and path.endswith("/chat/completions"):
                request = json.loads(body)
                self.requests.append(request)
                reply = self.replies.popleft() if self.replies else Reply()
                await self._complete(reader, writer, request, reply)
            else:
                await self._json(writer, 404, {"error": {"message": "not found", "type": "not_found"}})
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _wait_close(self, reader: asyncio.StreamReader) -> None:
        """Hold the connection until the client closes it; record when."""
        while await reader.read(1024):
            pass
        self.closed.append(time.monotonic())

    async def _json(self, writer: asyncio.StreamWriter, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        writer.write(
            f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
            "connection: close\r\n\r\n".encode() + data
        )
        await writer.drain()

    async def _complete(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: dict[str, Any], reply: Reply
    ) -> None:
        if reply.hold_before_headers:
            await self._wait_close(reader)
            return
        if reply.status != 200:
            await self._json(writer, reply.status, {"error": {"message": f"scripted {reply.status}",
                                                              "type": "server_error"}})
            return
        if not request.get("stream"):
            text = "".join(reply.pieces)
            await self._json(writer, 200, {
                "id": "c", "object": "chat.completion", "created": 0, "model": "stub",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": len(reply.pieces), "total_tokens": 1},
            })
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        writer.write(_frame({"role": "assistant", "content": ""}, None))  # role-only: not a first token
        await writer.drain()
        if reply.raw is not None:
            for frame in reply.raw:
                writer.write(frame)
            await writer.drain()
            return
        for i, piece in enumerate(reply.pieces):
            if reply.stall_after is not None and i >= reply.stall_after:
                await self._wait_close(reader)
                return
            if reply.gap_s:
                try:  # wait the gap, noticing a client that leaves meanwhile
                    if not await asyncio.wait_for(reader.read(1024), reply.gap_s):
                        self.closed.append(time.monotonic())
                        return
                except TimeoutError:
                    pass
            writer.write(_frame({"content": piece}, None))
            await writer.drain()
        if reply.stall_after is not None:
            await self._wait_close(reader)
            return
        writer.write(_frame({}, "stop"))
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()


def _frame(delta: dict[str, Any], finish: str | None) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "stub",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(chunk)}\n\n".encode()
