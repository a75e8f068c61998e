"""Where the S3 emulator's CPU per footer request goes: moto's app, our fault-injection wrapper,
and the HTTP server around them.

    python benchmarks/s3_emulator_cost.py [--requests 3000] [--rounds 3]

In this process, without sockets: a ranged GET (the footer read planning makes) and a HEAD are
sent ``--requests`` times to (a) a trivial WSGI app (what werkzeug's test client costs by
itself), (b) moto's app alone and (c) moto's app behind ``tests/servers.FaultyApp`` with the
30 ms stall of the many-files benchmark set to 0 s (the wrapper's bookkeeping without the
sleep), alternating, ``--rounds`` times; CPU microseconds per request, medians. Then the served
emulator (``servers.start_store("s3")``, a threaded werkzeug server in a child process): its CPU
per request for the same GETs over HTTP from one client thread, so that what the HTTP server
adds is the difference. Last, the GCS emulator's and Azurite's CPU per ranged GET (no added
latency), for comparison. Prints a table and JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

from proc_stats import process_cpu_s  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))


def _blob() -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table({"id": list(range(10))}), sink)
    return sink.getvalue()


def _cpu_us(send: Callable[[int], None], count: int) -> float:
    started = time.process_time()
    for i in range(count):
        send(i)
    return 1e6 * (time.process_time() - started) / count


def in_process(requests: int, rounds: int, blob: bytes) -> dict:
    from moto.server import DomainDispatcherApplication, create_backend_app
    from s3_faults import Faults, FaultyApp
    from werkzeug.test import Client

    moto_app = DomainDispatcherApplication(create_backend_app)
    faults = Faults()
    faults.inject("stall", -1, stall_seconds=0.0)

    def trivial(environ: dict, start: Callable) -> list[bytes]:
        start("200 OK", [("Content-Length", "2")])
        return [b"ok"]

    apps = {"trivial WSGI app": trivial, "moto": moto_app, "moto + FaultyApp": FaultyApp(moto_app, faults)}
    setup = Client(moto_app)
    setup.put("/bucket-a", headers={"Host": "127.0.0.1"})
    for i in range(requests):
        setup.put(f"/bucket-a/f{i:06d}.parquet", data=blob, headers={"Host": "127.0.0.1"})
    size = len(blob)
    found: dict[str, dict[str, list[float]]] = {name: {"GET": [], "HEAD": []} for name in apps}
    for _ in range(rounds):
        for name, app in apps.items():
            client = Client(app)
            headers = {"Host": "127.0.0.1", "Range": f"bytes=0-{size - 1}"}
            for method in ("GET", "HEAD"):
                send = getattr(client, method.lower())
                found[name][method].append(_cpu_us(lambda i, send=send, headers=headers: send(f"/bucket-a/f{i:06d}.parquet", headers=headers).close(), requests))
    return {name: {method: statistics.median(v) for method, v in methods.items()} for name, methods in found.items()}


def served(requests: int, blob: bytes) -> dict:
    import servers

    store = servers.start_store("s3")
    pid = store.server._proc.pid
    try:
        fs = store.fs
        fs.pipe({f"{servers.BUCKET}/cost/f{i:06d}.parquet": blob for i in range(requests)})
        import http.client

        host = store.server.endpoint.split("//")[1]
        connection = http.client.HTTPConnection(host)
        size = len(blob)

        def get(i: int) -> None:
            connection.request("GET", f"/{servers.BUCKET}/cost/f{i:06d}.parquet", headers={"Range": f"bytes=0-{size - 1}"})
            connection.getresponse().read()

        result = {}
        for stalled in (False, True):
            store.server.faults.inject("stall", -1, stall_seconds=0.0) if stalled else store.server.faults.clear()
            before = process_cpu_s(pid)
            client_us = _cpu_us(get, requests)
            result["FaultyApp stall 0 s" if stalled else "FaultyApp idle"] = {"server_us": 1e6 * (process_cpu_s(pid) - before) / requests, "client_us": client_us}
        return result
    finally:
        store.server.stop()


def other_emulators(requests: int, blob: bytes) -> dict:
    """The CPU per ranged GET of the GCS emulator (gcp-storage-emulator, Python) and of Azurite
    (Node.js), without added latency, each read once through its fsspec client from one thread."""
    import servers

    found = {}
    for name in ("gcs", "azure"):
        try:
            store = servers.start_store(name)
        except RuntimeError as error:  # Azurite not installed
            found[name] = {"error": str(error)}
            continue
        try:
            fs = store.fs
            fs.pipe({f"{servers.BUCKET}/cost/f{i:06d}.parquet": blob for i in range(requests)})
            paths = [f"{servers.BUCKET}/cost/f{i:06d}.parquet" for i in range(requests)]
            pid = store.server._proc.pid
            before, client = process_cpu_s(pid), time.process_time()
            for path in paths:
                fs.cat_file(path, start=0, end=len(blob))
            found[name] = {"server_us": 1e6 * (process_cpu_s(pid) - before) / requests, "client_us": 1e6 * (time.process_time() - client) / requests}
        finally:
            store.server.stop()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    blob = _blob()
    results = {"load_average": os.getloadavg(), "in_process_us": in_process(args.requests, args.rounds, blob), "served": served(args.requests, blob)}
    results["other_emulators"] = other_emulators(args.requests, blob)
    print(f"load average: {', '.join(f'{x:.1f}' for x in results['load_average'])}")
    print("| emulator part | CPU µs per GET | per HEAD |\n|---|---|---|")
    for name, value in results["in_process_us"].items():
        print(f"| {name} (in process) | {value['GET']:.0f} | {value['HEAD']:.0f} |")
    for name, value in results["served"].items():
        print(f"| served over HTTP, {name} | {value['server_us']:.0f} | |")
    for name, value in results["other_emulators"].items():
        print(f"| {name} emulator, served (client CPU {value.get('client_us', 0):.0f} µs) | {value.get('server_us', float('nan')):.0f} | |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
