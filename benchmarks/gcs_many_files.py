"""Planning many files cold on the GCS emulator with 30 ms added to every request.

    python benchmarks/gcs_many_files.py [--files 10000,100000] [--latency 0.03] [--close-connections]

The GCS emulator (gcp-storage-emulator, in memory) costs about a quarter of moto's CPU per
request, so it shows what planning costs the client at a size the S3 emulator cannot serve on
2 cores. Uploading through its API costs more per object the more it holds (it rewrites every
object's metadata as JSON on each upload), so the emulator is started in a child process with
the files (10-row Parquet files, ``many/f000000.parquet`` ...) already in its storage, and every
request waits ``--latency`` seconds in the server before it is handled. Connections are kept
alive, as object stores keep them (``--close-connections``: a connection per request, HTTP/1.0,
http.server's default, which the figures before keep-alive were measured with). For each count: planning
wall and CPU seconds, the emulator's CPU per file, the load average. One JSON line per count.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time

from proc_stats import process_cpu_s  # noqa: E402

BUCKET = "bucket-a"
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # no gRPC probe of the bucket's type (the emulator has no gRPC)


def _blob() -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table({"id": list(range(10))}), sink)
    return sink.getvalue()


def serve(files: int, latency: float, close: bool = False) -> None:
    """(Child) the emulator with ``files`` objects, each request held ``latency`` seconds;
    connections kept alive as object stores keep them, unless ``close``."""
    from functools import partial
    from http.server import ThreadingHTTPServer

    from gcp_storage_emulator.handlers.buckets import _make_bucket_resource
    from gcp_storage_emulator.handlers.objects import _checksums, _make_object_resource
    from gcp_storage_emulator.server import RequestHandler
    from gcp_storage_emulator.storage import Storage

    storage = Storage(use_memory_fs=True)
    storage._write_config_to_file = lambda: None  # nothing to persist in memory; it is O(objects) per upload
    storage.create_bucket(BUCKET, _make_bucket_resource(BUCKET))
    blob = _blob()
    for i in range(files):
        name = f"many/f{i:06d}.parquet"
        resource = _checksums(blob, _make_object_resource("http://localhost", BUCKET, name, "application/octet-stream", len(blob)))
        storage.create_file(BUCKET, name, blob, resource)

    class Held(RequestHandler):
        # HTTP/1.1 keeps connections open (http.server's default, 1.0, closes each after one
        # request: a TCP connection per request, which costs client and emulator a third more CPU);
        # without Nagle's algorithm, as the header and the body are written apart
        protocol_version = "HTTP/1.0" if close else "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            time.sleep(latency)
            super().do_GET()

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 512

    server = Server(("127.0.0.1", 0), partial(Held, storage))
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


def _footers_in_flight(dataset: object) -> int:
    from torch_dataloader_utils.storage import remote

    return getattr(remote, "TAILS_IN_FLIGHT", 1) * dataset._catalog.fs.options.max_concurrency  # type: ignore[attr-defined]


def plan(files: int, latency: float, close: bool = False) -> dict:
    command = [sys.executable, __file__, "--serve", str(files), "--latency", str(latency)] + (["--close-connections"] if close else [])
    child = subprocess.Popen(command, stdout=subprocess.PIPE)
    try:
        line = child.stdout.readline().decode()  # type: ignore[union-attr]
        assert line.startswith("PORT "), line
        options = {"endpoint_url": f"http://127.0.0.1:{int(line.split()[1])}", "token": "anon", "project": "test"}
        from torch_dataloader_utils import StructuredDataset

        server, wall, cpu = process_cpu_s(child.pid), time.perf_counter(), time.process_time()
        dataset = StructuredDataset(f"gs://{BUCKET}/many/", num_workers=0, storage_options=options)
        wall, cpu, server = time.perf_counter() - wall, time.process_time() - cpu, process_cpu_s(child.pid) - server
        assert len(dataset.files) == files, len(dataset.files)
        return {
            "files": files, "latency_s": latency, "plan_s": wall, "client_cpu_s": cpu, "client_cpu_ms_per_file": 1000 * cpu / files,
            "server_cpu_ms_per_file": 1000 * server / files, "requests": dataset._catalog.fs.stats["requests"],
            "concurrency": dataset._catalog.fs.options.max_concurrency, "footers_in_flight": _footers_in_flight(dataset), "connections": "closed" if close else "kept", "load_average": os.getloadavg(),
        }  # fmt: skip
    finally:
        child.terminate()
        child.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", default="10000,100000")
    parser.add_argument("--latency", type=float, default=0.03)
    parser.add_argument("--close-connections", action="store_true", help="a connection per request (HTTP/1.0), as measured before")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.latency, args.close_connections)
        return
    for files in (int(n) for n in args.files.split(",")):
        print(json.dumps(plan(files, args.latency, args.close_connections)), flush=True)


if __name__ == "__main__":
    main()
