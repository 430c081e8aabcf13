"""A TCP proxy a test can pause: ``python -m tests.state.tcp_proxy HOST PORT`` prints its port, then forwards.

SIGSTOP it and every connection through it stalls while the kernel still ACKs (the stall of a
frozen server or a black-holed route: no RST, no FIN, so neither ``statement_timeout`` nor TCP
timeouts fire); SIGCONT and they flow again.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def main() -> None:
    """Listen on a free loopback port, print it, forward each connection to HOST:PORT."""
    host, port = sys.argv[1], int(sys.argv[2])
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    print(listener.getsockname()[1], flush=True)
    while True:
        client, _ = listener.accept()
        try:
            upstream = socket.create_connection((host, port))
        except OSError:
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


if __name__ == "__main__":
    main()
