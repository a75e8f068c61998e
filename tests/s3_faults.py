"""The S3 test server's fault injection: a WSGI layer in front of moto's app that counts the object
bytes sent and can answer the first N reads of each object with a 503, a connection reset
mid-body or a stall (``Faults``, ``FaultyApp``), and the tests' handle on it over HTTP
(``FaultsClient``: ``store.server.faults.inject("503", 1)``). servers.py runs the server."""

from __future__ import annotations

import inspect
import json
import socket
import struct
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable


@dataclass
class Faults:
    """What the S3 server does to object reads, and what it has sent. Thread safe."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    mode: str | None = None  # "503", "reset" (cut the body and reset the connection), "stall"
    times: int = 0  # fail the first `times` reads of each matching object
    match: str = ""  # substring of the object key; "" matches every object
    stall_seconds: float = 3.0
    after: int = 0  # reads of each object that pass before the failures start
    seen: dict = field(default_factory=dict)  # key -> object reads seen since inject()
    injected: int = 0
    object_bytes: int = 0  # body bytes of object reads (GET of a key), all time
    object_reads: int = 0
    head_requests: int = 0  # HEAD requests (object metadata), all time
    metadata_stall_seconds: float = 0.0  # HEADs and listings wait this long before the answer (0: none)
    in_flight: int = 0
    peak: int = 0
    recording: bool = False
    log: list = field(default_factory=list)  # (key, (start, end)) of object reads while recording

    CONTROL = ("inject", "clear", "counters", "head_count", "stall_metadata", "injected_count", "record", "take_log", "reset_peak", "peak_in_flight")

    def inject(self, mode: str | None, times: int = 0, match: str = "", stall_seconds: float = 3.0, after: int = 0) -> None:
        """Fail the first ``times`` reads (-1: all) of each object whose key contains ``match``,
        counted from its read number ``after`` (the reads before it pass)."""
        with self.lock:
            self.mode, self.times, self.match, self.seen, self.injected = mode, times, match, {}, 0
            self.stall_seconds, self.after = stall_seconds, after

    def clear(self) -> None:
        self.inject(None)
        self.stall_metadata(0.0)

    def counters(self) -> tuple[int, int]:
        """(object body bytes sent, object reads) since the server started."""
        with self.lock:
            return self.object_bytes, self.object_reads

    def head_count(self) -> int:
        """HEAD requests (object metadata) since the server started."""
        with self.lock:
            return self.head_requests

    def note_metadata(self, head: bool) -> float:
        """Count a request that is not an object read (a HEAD counts); returns how long to stall it."""
        with self.lock:
            self.head_requests += head
            return self.metadata_stall_seconds

    def stall_metadata(self, seconds: float) -> None:
        """Make every HEAD request and listing wait ``seconds`` before its answer."""
        with self.lock:
            self.metadata_stall_seconds = seconds

    def injected_count(self) -> int:
        with self.lock:
            return self.injected

    def record(self, on: bool) -> None:
        with self.lock:
            self.recording, self.log = on, []

    def take_log(self) -> list:
        with self.lock:
            log, self.log = self.log, []
            return log

    def reset_peak(self) -> None:
        with self.lock:
            self.peak = self.in_flight

    def peak_in_flight(self) -> int:
        with self.lock:
            return self.peak

    def begin(self, key: str, byte_range: str | None) -> None:
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            if self.recording:
                self.log.append((key, _parse_range(byte_range)))

    def end(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def decide(self, key: str) -> str | None:
        with self.lock:
            self.object_reads += 1
            if self.mode is None or self.match not in key:
                return None
            count = self.seen.get(key, 0) - self.after
            self.seen[key] = self.seen.get(key, 0) + 1
            if count >= 0 and (self.times < 0 or count < self.times):
                self.injected += 1
                return self.mode
            return None

    def sent(self, n: int) -> None:
        with self.lock:
            self.object_bytes += n


def _parse_range(header: str | None) -> tuple[int, int] | None:
    if not header or not header.startswith("bytes="):
        return None
    first, _, last = header[6:].partition("-")
    return int(first), int(last) + 1


def _object_key(environ: dict) -> str | None:
    """The bucket/key of a GET of one object (not a listing or bucket call), else None."""
    if environ["REQUEST_METHOD"] != "GET":
        return None
    path = environ.get("PATH_INFO", "").lstrip("/")
    bucket, _, key = path.partition("/")
    if not key or "list-type" in environ.get("QUERY_STRING", ""):
        return None
    return path


def _reset(environ: dict) -> None:
    sock = environ.get("werkzeug.socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


class FaultyApp:
    """WSGI layer in front of moto's app: counts object bytes sent, injects faults."""

    def __init__(self, app: Callable, faults: Faults):
        self.app = app
        self.faults = faults

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "").startswith("/__control__/"):
            return self._control(environ, start_response)
        key = _object_key(environ)
        if key is None:
            time.sleep(self.faults.note_metadata(environ["REQUEST_METHOD"] == "HEAD"))
            return self.app(environ, start_response)
        self.faults.begin(key, environ.get("HTTP_RANGE"))
        try:
            return self._finish(self._serve(key, environ, start_response))
        except BaseException:
            self.faults.end()
            raise

    def _control(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        method = environ["PATH_INFO"].rsplit("/", 1)[1]
        length = int(environ.get("CONTENT_LENGTH") or 0)
        kwargs = json.loads(environ["wsgi.input"].read(length) or b"{}")
        if method not in Faults.CONTROL:
            start_response("404 Not Found", [("Content-Length", "0")])
            return [b""]
        body = json.dumps(getattr(self.faults, method)(**kwargs)).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    def _serve(self, key: str, environ: dict, start_response: Callable) -> Iterable[bytes]:
        action = self.faults.decide(key)
        if action == "503":
            body = b"<?xml version='1.0'?><Error><Code>ServiceUnavailable</Code><Message>injected</Message></Error>"
            start_response("503 Service Unavailable", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
            return [body]
        if action == "stall":
            time.sleep(self.faults.stall_seconds)
        return self._counted(self.app(environ, start_response), environ, cut=action == "reset")

    def _finish(self, body: Iterable[bytes]) -> Iterable[bytes]:
        try:
            yield from body
        finally:
            self.faults.end()

    def _counted(self, body: Iterable[bytes], environ: dict, cut: bool) -> Iterable[bytes]:
        try:
            for chunk in body:
                if cut:
                    half = chunk[: len(chunk) // 2]
                    self.faults.sent(len(half))
                    yield half
                    _reset(environ)
                    return
                self.faults.sent(len(chunk))
                yield chunk
        finally:
            close = getattr(body, "close", None)
            if close:
                close()


class FaultsClient:
    """The S3 server's Faults, called over HTTP: ``client.inject("503", 1)`` etc."""

    def __init__(self, endpoint: str):
        self._endpoint = endpoint

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method not in Faults.CONTROL:
            raise AttributeError(method)

        def call(*args: Any, **kwargs: Any) -> Any:
            names = inspect.signature(getattr(Faults, method)).parameters
            kwargs.update(zip(list(names)[1:], args))
            request = urllib.request.Request(f"{self._endpoint}/__control__/{method}", data=json.dumps(kwargs).encode(), method="POST")
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())

        return call
