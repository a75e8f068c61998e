"""Real object-store servers for the tests, each a child process on a free loopback port.

- S3: moto's server app on a threaded werkzeug server, behind a WSGI layer that
  counts the object bytes the server sends and can inject faults (HTTP 503,
  connections reset mid-body, stalls) into the first N reads of each object;
  the tests drive it through ``/__control__/<method>`` (see ``FaultsClient``).
- GCS: gcp-storage-emulator's request handler on a threaded HTTP server.
- Azure Blob: Azurite (npm, ``node_modules/.bin/azurite-blob``).

Servers run in their own processes, never in the test process: DataLoader
workers are forked from it and would otherwise inherit the servers' sockets
(keeping connections the server closed half alive).

A server that cannot start is an error, never a skip: CI installs all three.
Import the fixtures into a test module: ``from servers import object_store, s3``.
"""

from __future__ import annotations

import os

os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # before gcsfs is imported anywhere

import inspect
import json
import logging
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable

import fsspec
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AZURITE = os.path.join(REPO, "node_modules", ".bin", "azurite-blob")
AZURE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
BUCKET = "bucket-a"

logging.getLogger("werkzeug").setLevel(logging.ERROR)
logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)
logging.getLogger("azure").setLevel(logging.ERROR)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, seconds: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}: {proc.stdout.read().decode(errors='replace')[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {seconds}s")


# --------------------------------------------------------------------------- S3 faults
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


def serve_s3() -> Any:
    """moto's S3 app behind FaultyApp on a threaded werkzeug server (run in a child process)."""
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    app = FaultyApp(DomainDispatcherApplication(create_backend_app), Faults())
    return make_server("127.0.0.1", 0, app, threaded=True)


def serve_gcs() -> Any:
    """gcp-storage-emulator's handler and in-memory storage on a threaded HTTP server."""
    from http.server import ThreadingHTTPServer

    from gcp_storage_emulator.server import RequestHandler
    from gcp_storage_emulator.storage import Storage

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 128

    return Server(("127.0.0.1", 0), partial(RequestHandler, Storage(use_memory_fs=True)))


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


class ChildServer:
    """``python servers.py s3|gcs`` as a child process; it prints its port when ready."""

    def __init__(self, kind: str):
        self._proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), kind], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO
        )
        line = self._proc.stdout.readline().decode()
        if not line.startswith("PORT "):
            rest = self._proc.stdout.read().decode(errors="replace") if self._proc.poll() is not None else ""
            self.stop()
            raise RuntimeError(f"the {kind} server did not start: {line}{rest[-3000:]}")
        self.endpoint = f"http://127.0.0.1:{int(line.split()[1])}"
        self.faults = FaultsClient(self.endpoint) if kind == "s3" else None
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for _ in self._proc.stdout:
            pass

    def stop(self) -> None:
        _stop(self._proc)


def _stop(proc: subprocess.Popen) -> None:
    """Terminate a server process, killing it if it does not exit within 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies (Linux; elsewhere a no-op)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class AzureServer:
    """Azurite's blob service, in memory, as a child process."""

    def __init__(self) -> None:
        if not os.path.exists(AZURITE) or shutil.which("node") is None:
            raise RuntimeError(f"Azurite is not installed ({AZURITE}); run `npm ci` in {REPO}")
        self.port = free_port()
        cmd = [AZURITE, "--inMemoryPersistence", "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--skipApiVersionCheck", "--loose"]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO, preexec_fn=_die_with_parent)
        try:
            wait_for_port(self.port, 60, self._proc)
        except BaseException:
            self.stop()
            raise
        self.endpoint = f"http://127.0.0.1:{self.port}/devstoreaccount1"
        self.faults = None

    def stop(self) -> None:
        _stop(self._proc)


# --------------------------------------------------------------------------- a store handle
@dataclass
class Store:
    """One running server as the tests see it: URLs, storage_options and an fsspec client."""

    name: str  # "s3", "gcs", "azure"
    scheme: str  # URL scheme used in paths
    options: dict
    server: Any

    @property
    def fs(self) -> Any:
        return fsspec.filesystem(self.scheme, **self.options)

    def url(self, prefix: str) -> str:
        return f"{self.scheme}://{BUCKET}/{prefix.strip('/')}/"

    def upload(self, local_dir: str, prefix: str) -> list[str]:
        """Copy every file of local_dir to bucket-a/prefix/; returns the object URLs."""
        fs = self.fs
        urls = []
        for name in sorted(os.listdir(local_dir)):
            with open(os.path.join(local_dir, name), "rb") as handle:
                fs.pipe_file(f"{BUCKET}/{prefix.strip('/')}/{name}", handle.read())
            urls.append(f"{self.scheme}://{BUCKET}/{prefix.strip('/')}/{name}")
        fs.invalidate_cache()
        return urls


def s3_options(endpoint: str, client_retries: bool = True) -> dict:
    options: dict = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-west-2"},
    }
    if not client_retries:  # botocore's retries and read timeout out of the way (s3fs's own: S3FileSystem.retries)
        options["config_kwargs"] = {"retries": {"total_max_attempts": 1}, "read_timeout": 300}
    return options


def _make_bucket(fs: Any) -> None:
    try:
        fs.mkdir(BUCKET)
    except FileExistsError:
        pass


def start_store(name: str) -> Store:
    if name == "s3":
        server = ChildServer("s3")
        store = Store("s3", "s3", s3_options(server.endpoint), server)
    elif name == "gcs":
        server = ChildServer("gcs")
        store = Store("gcs", "gs", {"endpoint_url": server.endpoint, "token": "anon", "project": "test"}, server)
    elif name == "azure":
        server = AzureServer()
        connection = (
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
            f"AccountKey={AZURE_KEY};BlobEndpoint={server.endpoint};"
        )
        store = Store("azure", "abfs", {"connection_string": connection}, server)
    else:
        raise ValueError(name)
    _make_bucket(store.fs)
    return store


STORES = ("s3", "gcs", "azure")
_running: dict[str, Store] = {}


@pytest.fixture(scope="session")
def store_registry():
    """Servers started on first use, stopped at the end of the session."""
    yield _running
    for store in _running.values():
        store.server.stop()
    _running.clear()


def get_store(name: str, registry: dict) -> Store:
    if name not in registry:
        registry[name] = start_store(name)
    return registry[name]


@pytest.fixture(scope="session", params=STORES)
def object_store(request, store_registry) -> Store:
    """Each of the three servers in turn."""
    return get_store(request.param, store_registry)


@pytest.fixture(scope="session")
def s3(store_registry) -> Store:
    """The moto S3 server (byte counters and fault injection in ``s3.server.faults``)."""
    return get_store("s3", store_registry)


def _exit_with_parent() -> None:
    """Stop when the process that started this server is gone (killed tests leave no server)."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(0)


def _main(kind: str) -> None:
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    server = {"s3": serve_s3, "gcs": serve_gcs}[kind]()
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    _main(sys.argv[1])
