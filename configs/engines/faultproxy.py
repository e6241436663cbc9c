"""A fault-injecting HTTP/1.1 proxy between the workers and an object store (the engines stage's storage-fault
tests and bench/engines.py's byte counts): it forwards each request of a client connection to the store on a
connection of its own, and counts what each side sent; rules (:class:`Fault`) answer chosen requests with an
error of the store's own kind (S3 ``503 SlowDown``, ``500 InternalError``; GCS JSON errors), cut a response off
in the middle of its body (a TCP reset), hold a request for seconds (a stall), and every request can be delayed
(``latency_ms``).

toxiproxy, the usual tool, works on TCP streams: it can delay, cut and reset, but it cannot answer a request with
an HTTP status, which is what a store under load does (S3 ``SlowDown``), so the faults here are HTTP-aware.

    proxy = FaultProxy(("127.0.0.1", store_port), latency_ms=50).start()
    proxy.add(Fault("status", status=503, times=3, method="PUT"))   # the next 3 PUTs get 503 SlowDown
    ... use proxy.url as the store's endpoint ...
    proxy.stop()
"""

from __future__ import annotations

import dataclasses
import socket
import struct
import threading
import time

_S3_ERRORS = {
    503: ("SlowDown", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
}


@dataclasses.dataclass
class Fault:
    """One rule: the next ``times`` requests that match (``method`` and ``path`` substring, None = any) get it.

    kind: ``"status"`` (answered with ``status`` by the proxy, never forwarded), ``"reset"`` (forwarded; the
      response's head and ``after_bytes`` of its body are sent, then the connection is reset), ``"stall"``
      (held ``seconds``, then forwarded), ``"strip"`` (forwarded without its ``header``: a proxy or gateway that
      drops a header that was not signed), ``"accept"`` (forwarded; a ``412 Precondition Failed`` answer is
      replaced by ``200 OK``: the client sees its conditional write accepted, as a store that ignores the
      condition answers; the store's object is unchanged).
    """

    kind: str
    times: int = 1
    method: str | None = None
    path: str | None = None
    status: int = 503
    after_bytes: int = 1024
    seconds: float = 10.0
    min_body: int = 0  # reset: only responses whose body is at least this long (a data read, not a HEAD)
    header: str = ""  # strip: the request header taken out (case-insensitive)
    applied: int = 0

    def matches(self, method: str, path: str) -> bool:
        return (
            self.applied < self.times
            and (self.method is None or self.method == method)
            and (self.path is None or self.path in path)
        )


class _Closed(Exception):
    pass


def _read_head(sock: socket.socket, buf: bytearray) -> bytes:
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise _Closed
        buf += data
    end = buf.index(b"\r\n\r\n") + 4
    head = bytes(buf[:end])
    del buf[:end]
    return head


def _headers(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    out = {}
    for line in lines:
        if ":" in line:
            k, v = line.split(":", 1)
            out[k.strip().lower()] = v.strip()
    return out


def _read_exact(sock: socket.socket, buf: bytearray, n: int):
    """Yields the next ``n`` bytes of the stream (``buf`` first) in pieces."""
    while n > 0:
        if not buf:
            data = sock.recv(min(1 << 20, max(n, 65536)))
            if not data:
                raise _Closed
            buf += data
        piece = bytes(buf[:n])
        del buf[: len(piece)]
        n -= len(piece)
        yield piece


def _read_chunked(sock: socket.socket, buf: bytearray):
    """Yields the raw bytes of a chunked body (sizes, data and trailer included) in pieces."""
    while True:
        while b"\r\n" not in buf:
            data = sock.recv(65536)
            if not data:
                raise _Closed
            buf += data
        end = buf.index(b"\r\n") + 2
        line = bytes(buf[:end])
        del buf[:end]
        yield line
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while True:  # trailer lines up to an empty one
                while b"\r\n" not in buf:
                    data = sock.recv(65536)
                    if not data:
                        raise _Closed
                    buf += data
                end = buf.index(b"\r\n") + 2
                line = bytes(buf[:end])
                del buf[:end]
                yield line
                if line == b"\r\n":
                    return
        yield from _read_exact(sock, buf, size + 2)


def _body(sock, buf, headers: dict, request: bool, method: str = "", status: int = 200):
    if not request and (method == "HEAD" or status in (204, 304) or 100 <= status < 200):
        return iter(())
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return _read_chunked(sock, buf)
    if "content-length" in headers:
        return _read_exact(sock, buf, int(headers["content-length"]))
    if request:
        return iter(())

    def until_close():
        if buf:
            yield bytes(buf)
            buf.clear()
        while True:
            data = sock.recv(1 << 20)
            if not data:
                return
            yield data

    return until_close()


class FaultProxy:
    """Forwards HTTP/1.1 connections from ``127.0.0.1:port`` to ``upstream``, with :class:`Fault` rules.

    Counters: ``requests``, ``to_store`` (request bytes forwarded to the store: heads and bodies), ``from_store``
    (response bytes the store sent), ``faults`` (rules applied, by kind), ``copies`` (the paths of the objects the
    store wrote by a server-side copy, S3's ``x-amz-copy-source`` requests: bytes that never cross the proxy but
    that the store writes again)."""

    def __init__(self, upstream: tuple[str, int], latency_ms: float = 0.0, gcs: bool = False):
        self.upstream, self.latency, self.gcs = upstream, latency_ms / 1000.0, gcs
        self.rules: list[Fault] = []
        self.requests = self.to_store = self.from_store = 0
        self.faults: dict[str, int] = {}
        self.copies: list[str] = []
        self.log: list[tuple[str, str, int]] = []  # (method, path, status) of every answered request
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(256)
        self.port = self._listener.getsockname()[1]
        self._stopped = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        threading.Thread(target=self._accept, daemon=True, name="faultproxy-accept").start()
        return self

    def stop(self) -> None:
        self._stopped = True
        try:
            self._listener.close()
        except OSError:
            pass

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.rules.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def reset_counts(self) -> None:
        with self._lock:
            self.requests = self.to_store = self.from_store = 0
            self.faults.clear()
            self.copies.clear()
            self.log.clear()

    def _rule(self, method: str, path: str, kinds) -> Fault | None:
        with self._lock:
            for rule in self.rules:
                if rule.kind in kinds and rule.matches(method, path):
                    return rule
        return None

    def _applied(self, rule: Fault) -> None:
        with self._lock:
            rule.applied += 1
            self.faults[rule.kind] = self.faults.get(rule.kind, 0) + 1

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True, name="faultproxy-conn").start()

    def _error(self, status: int, path: str) -> bytes:
        if self.gcs:
            body = (
                f'{{"error": {{"code": {status}, "message": "injected by the fault proxy", '
                f'"errors": [{{"reason": "backendError"}}]}}}}'
            ).encode()
            ctype = "application/json"
        else:
            code, message = _S3_ERRORS.get(status, ("InternalError", "injected"))
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
                f"<Resource>{path}</Resource><RequestId>faultproxy</RequestId></Error>"
            ).encode()
            ctype = "application/xml"
        reason = {503: "Service Unavailable", 500: "Internal Server Error"}.get(status, "Error")
        return (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )

    def _serve(self, client: socket.socket) -> None:
        server = None
        cbuf, sbuf = bytearray(), bytearray()
        try:
            while True:
                head = _read_head(client, cbuf)
                method, path = head.split(b" ", 2)[:2]
                method, path = method.decode(), path.decode("latin-1")
                headers = _headers(head)
                if headers.get("expect", "").lower() == "100-continue":
                    # botocore waits up to a second for this before it sends a body: answer at once, and take
                    # the header out of what the store gets (its own 100 would come before the response)
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    head = b"\r\n".join(line for line in head.split(b"\r\n") if not line.lower().startswith(b"expect:"))
                body = b"".join(_body(client, cbuf, headers, request=True))
                with self._lock:
                    self.requests += 1
                    if "x-amz-copy-source" in headers:
                        self.copies.append(path.split("?", 1)[0])
                if self.latency:
                    time.sleep(self.latency)
                rule = self._rule(method, path, ("status",))
                if rule is not None:
                    self._applied(rule)
                    client.sendall(self._error(rule.status, path))
                    with self._lock:
                        self.log.append((method, path, rule.status))
                    continue
                rule = self._rule(method, path, ("strip",))
                if rule is not None and f"{rule.header.lower()}:".encode() in head.lower():
                    self._applied(rule)
                    head = b"\r\n".join(
                        line
                        for line in head.split(b"\r\n")
                        if not line.lower().startswith(f"{rule.header.lower()}:".encode())
                    )
                rule = self._rule(method, path, ("stall",))
                if rule is not None:
                    self._applied(rule)
                    time.sleep(rule.seconds)
                if server is None:
                    server = socket.create_connection(self.upstream, timeout=120)
                server.sendall(head + body)
                with self._lock:
                    self.to_store += len(head) + len(body)
                rhead = _read_head(server, sbuf)
                status = int(rhead.split(b" ", 2)[1])
                rheaders = _headers(rhead)
                with self._lock:
                    self.from_store += len(rhead)
                    self.log.append((method, path, status))
                accept = self._rule(method, path, ("accept",)) if status == 412 else None
                if accept is not None:
                    for _ in _body(server, sbuf, rheaders, request=False, method=method, status=status):
                        pass
                    self._applied(accept)
                    client.sendall(
                        b'HTTP/1.1 200 OK\r\nETag: "00000000000000000000000000000000"\r\nContent-Length: 0\r\n\r\n'
                    )
                    continue
                length = int(rheaders.get("content-length", "0") or 0)
                reset = self._rule(method, path, ("reset",))
                if reset is not None and (length < reset.min_body or length <= reset.after_bytes):
                    reset = None
                client.sendall(rhead)
                sent = 0
                for piece in _body(server, sbuf, rheaders, request=False, method=method, status=status):
                    with self._lock:
                        self.from_store += len(piece)
                    if reset is not None and sent + len(piece) >= reset.after_bytes:
                        client.sendall(piece[: reset.after_bytes - sent])
                        self._applied(reset)
                        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        client.close()  # RST: the client sees its body cut off mid-way
                        return
                    client.sendall(piece)
                    sent += len(piece)
                if rheaders.get("connection", "").lower() == "close":
                    return
        except (_Closed, OSError, ValueError, IndexError):
            return
        finally:
            for s in (client, server):
                if s is not None:
                    try:
                        s.close()
                    except OSError:
                        pass
