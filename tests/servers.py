"""Real object-store servers for the tests, each a child process on a free loopback port.

- S3: moto's server app on a threaded werkzeug server, behind a WSGI layer that
  counts the object bytes the server sends and can inject faults (HTTP 503,
  connections reset mid-body, stalls) into the first N reads of each object;
  the tests drive it through ``/__control__/<method>`` (s3_faults.py).
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

import logging
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import fsspec
import pytest
from s3_faults import Faults, FaultsClient, FaultyApp

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
