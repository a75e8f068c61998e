"""The footer (tail) requests of planning alone, through s3fs and through pyarrow's C++ client,
on the S3 emulator with 30 ms added to every request.

    python benchmarks/footer_requests.py [--files 2000] [--rounds 2]

Uploads ``--files`` 10-row Parquet files to moto's server (tests/servers.py), lists them once,
then fetches every file's tail with ``RemoteStore.prefetch_tails`` (what planning does before it
parses the footers), through s3fs (``TDU_ARROW_FOOTERS=0``) and through pyarrow, alternating,
``--rounds`` times: wall seconds, the client's and the emulator's CPU per file, the most
requests in flight. One JSON line per run, then the load average.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time

from proc_stats import process_cpu_s  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
LATENCY_S = 0.03


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    import pyarrow as pa
    import pyarrow.parquet as pq
    import servers

    from torch_dataloader_utils.catalog.arrow_tails import arrow_tails
    from torch_dataloader_utils.storage.remote import IOOptions, open_store
    from torch_dataloader_utils.storage.versions import FileEntry

    store = servers.start_store("s3")
    pid = store.server._proc.pid
    try:
        sink = io.BytesIO()
        pq.write_table(pa.table({"id": list(range(10))}), sink)
        blob = sink.getvalue()
        paths = [f"{servers.BUCKET}/tails/f{i:06d}.parquet" for i in range(args.files)]
        store.fs.pipe(dict.fromkeys(paths, blob))
        entries = [FileEntry(path, f"s3://{path}", len(blob), None) for path in paths]
        faults = store.server.faults
        faults.inject("stall", -1, stall_seconds=LATENCY_S)
        faults.stall_metadata(LATENCY_S)
        for round_ in range(args.rounds):
            for path in ("fsspec", "arrow"):
                os.environ["TDU_ARROW_FOOTERS"] = "1" if path == "arrow" else "0"
                remote = open_store(store.fs, IOOptions())
                remote.fs  # noqa: B018 - the client made before the clock starts
                faults.reset_peak()
                server, wall, cpu = process_cpu_s(pid), time.perf_counter(), time.process_time()
                remote.prefetch_tails(entries, arrow_tails(remote))  # None (fsspec) with TDU_ARROW_FOOTERS=0
                wall, cpu, server = time.perf_counter() - wall, time.process_time() - cpu, process_cpu_s(pid) - server
                assert remote.stats["fetcher_reads"] == (args.files if path == "arrow" else 0), remote.stats
                print(json.dumps({
                    "files": args.files, "footer_path": path, "round": round_, "wall_s": round(wall, 2),
                    "client_cpu_ms_per_file": round(1000 * cpu / args.files, 3), "server_cpu_ms_per_file": round(1000 * server / args.files, 3),
                    "peak_in_flight": faults.peak_in_flight(), "load_average": os.getloadavg(),
                }), flush=True)  # fmt: skip
    finally:
        store.server.stop()


if __name__ == "__main__":
    main()
