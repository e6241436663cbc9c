"""A counting, delaying TCP proxy in front of an object-store endpoint (a moto server), for the remote benchmark
and tests: it counts the bytes the server sends (egress), the bytes clients send, the connections and the
requests (client-to-server chunks that start with an HTTP method: one per request on a kept-alive connection as on
a new one; moto's server closes every connection, so there they are equal), and can hold every client-to-server chunk for ``latency_ms`` (one request on a kept-alive connection is one
chunk), so a server on 127.0.0.1 answers with the round-trip time of a real object store.

    proxy = CountingProxy(("127.0.0.1", moto_port), latency_ms=20).start()
    ... use http://127.0.0.1:{proxy.port} as the endpoint ...
    proxy.egress_bytes, proxy.connections, proxy.requests
"""

from __future__ import annotations

import socket
import threading
import time

_METHODS = (b"GET ", b"HEAD ", b"PUT ", b"POST ", b"DELETE ")


class CountingProxy:
    """Forwards TCP connections from ``127.0.0.1:port`` to ``upstream``; thread per direction."""

    def __init__(self, upstream: tuple[str, int], latency_ms: float = 0.0):
        self.upstream, self.latency = upstream, latency_ms / 1000.0
        self.egress_bytes = 0  # server -> clients
        self.ingress_bytes = 0  # clients -> server
        self.connections = 0
        self.requests = 0  # client-to-server chunks starting with an HTTP method
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(256)
        self.port = self._listener.getsockname()[1]

    def start(self) -> CountingProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def reset(self) -> None:
        with self._lock:
            self.egress_bytes = self.ingress_bytes = self.connections = self.requests = 0

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, egress: bool) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if not egress and self.latency:
                    time.sleep(self.latency)
                with self._lock:
                    if egress:
                        self.egress_bytes += len(data)
                    else:
                        self.ingress_bytes += len(data)
                        self.requests += data.startswith(_METHODS)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._listener.close()


def main(argv=None) -> None:
    """``python -m bench.s3proxy UPSTREAM_PORT [--latency_ms N]``: runs the proxy in its own process (so its
    threads never compete with the measured process for the GIL); prints its port, then on every line read from
    stdin the counts as ``egress ingress connections requests``."""
    import argparse
    import sys

    ap = argparse.ArgumentParser()
    ap.add_argument("upstream_port", type=int)
    ap.add_argument("--latency_ms", type=float, default=0.0)
    args = ap.parse_args(argv)
    proxy = CountingProxy(("127.0.0.1", args.upstream_port), args.latency_ms).start()
    print(proxy.port, flush=True)
    for line in sys.stdin:
        if line.strip() == "reset":
            proxy.reset()
        print(proxy.egress_bytes, proxy.ingress_bytes, proxy.connections, proxy.requests, flush=True)


if __name__ == "__main__":
    main()
