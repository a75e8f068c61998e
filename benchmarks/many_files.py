"""Many tiny files: planning cold and warm, state size, resume time, memory, rows/s.

    python benchmarks/many_files.py [--dir /tmp/tdu-many-files] [--dirs 100] [--files-per-dir 1000]
        [--rows 100] [--object-store-files 2000,10000] [--json out.json]

Generates ``dirs x files_per_dir`` Parquet files of ``rows`` rows (``id`` int64, ``x`` float32;
once, kept under ``--dir``, marked complete by a hidden ``.complete`` file) and measures, each
step in a fresh process:

1. planning cold (no plan cache) and warm (the plan cache in a ``cache_dir``): wall and CPU
   seconds, RSS after importing the library and after planning, peak RSS;
2. one epoch with ``num_workers=2``: rows/s, the workers' CPU seconds (files per worker
   CPU-second), the size of ``state_dict()`` as JSON at 10, 50 and 90% of the epoch (the
   compact form ``auto`` picks, and the full form at 50% for comparison) and the time to take it;
3. resume: planning (warm) + ``load_state_dict`` of the 50% state + the first batch, wall and CPU;
4. planning ``--object-store-files`` files (2,000 and 10,000 by default) cold on the S3 emulator
   (moto's server) with 30 ms added to every request, footers read through s3fs (``fsspec``) and
   through pyarrow's C++ client (``arrow``), alternating: wall seconds, the client's and the
   emulator's CPU per file, and the bound the latency sets at the store client's concurrency;
5. 1,000,000 files on paper: the compact state's file summary of a synthetic 1M-file listing.

One step alone, in a fresh process (``--cache DIR``: the plan cache's directory, warm from the
second run; ``--state FILE``: where the epoch step saves its 50% state and the resume step reads it):

    python benchmarks/many_files.py --step plan --dir DATA [--cache DIR]
    python benchmarks/many_files.py --step epoch --dir DATA --cache DIR --state FILE
    python benchmarks/many_files.py --step resume --dir DATA --cache DIR --state FILE
    python benchmarks/many_files.py --step object_store --object-store-files 2000,10000 \
        [--object-store-rounds 2] [--footer-paths fsspec,arrow]

Wall seconds on a shared machine depend on its load: the CPU seconds of the measuring process
(and of the DataLoader workers) are reported next to them.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from proc_stats import process_cpu_s  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
LATENCY_S = 0.03  # added by the S3 emulator to every request of the object-store step


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def generate(root: str, dirs: int, per_dir: int, rows: int) -> float:
    """The dataset (once): file i holds ids [i * rows, (i + 1) * rows)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    marker = os.path.join(root, ".complete")
    spec = {"dirs": dirs, "files_per_dir": per_dir, "rows": rows}
    if os.path.exists(marker) and json.load(open(marker)) == spec:
        return 0.0
    started = time.perf_counter()
    for d in range(dirs):
        os.makedirs(f"{root}/d{d:03d}", exist_ok=True)
        for f in range(per_dir):
            i = d * per_dir + f
            ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
            pq.write_table(pa.table({"id": ids, "x": (ids % 7).astype(np.float32)}), f"{root}/d{d:03d}/part-{f:05d}.parquet")
    with open(marker, "w") as out:
        json.dump(spec, out)
    return time.perf_counter() - started


# ----------------------------------------------------------------------------- steps (one process each)
def step_plan(args: argparse.Namespace) -> dict:
    imported = rss_mb()
    from torch_dataloader_utils import StructuredDataset

    imported = rss_mb()
    wall, cpu = time.perf_counter(), time.process_time()
    dataset = StructuredDataset(args.dir, batch_size=1024, num_workers=2, cache_dir=args.cache)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"files": len(dataset.files), "wall_s": wall, "cpu_s": cpu, "rss_import_mb": imported, "rss_planned_mb": rss_mb(), "peak_mb": peak_mb()}


def step_epoch(args: argparse.Namespace) -> dict:
    from torch_dataloader_utils import StructuredDataset

    loader, dataset = StructuredDataset.create_dataloader(args.dir, batch_size=1024, num_workers=2, cache_dir=args.cache)
    batches = len(loader)
    marks = {round(batches * p): p for p in (0.1, 0.5, 0.9)}
    states: dict[str, Any] = {}
    rows = 0
    wall = time.perf_counter()
    for step, batch in enumerate(loader):
        rows += len(batch["id"])
        if step + 1 in marks:
            share = f"{marks[step + 1]:.0%}"
            taken = time.perf_counter()
            state = dataset.state_dict()
            taken = time.perf_counter() - taken
            text = json.dumps(state)
            states[share] = {"bytes": len(text), "form": "compact" if "completed_ranges" in state else "full", "take_ms": 1000 * taken}
            if share == "50%":
                with open(args.state, "w") as out:
                    out.write(text)
                states["50% full form"] = {"bytes": len(json.dumps(dataset.state_dict(form="full"))), "form": "full"}
    wall = time.perf_counter() - wall
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker_cpu = children.ru_utime + children.ru_stime
    files = len(dataset.files)
    return {
        "rows": rows, "wall_s": wall, "rows_per_s": rows / wall, "workers_cpu_s": worker_cpu,
        "files_per_worker_cpu_s": files / worker_cpu if worker_cpu else None, "files_per_s_per_worker_wall": files / wall / 2,
        "states": states, "main_peak_mb": peak_mb(),
    }  # fmt: skip


def step_resume(args: argparse.Namespace) -> dict:
    from torch_dataloader_utils import StructuredDataset

    with open(args.state) as f:
        state = json.load(f)
    wall, cpu = time.perf_counter(), time.process_time()
    loader, dataset = StructuredDataset.create_dataloader(args.dir, batch_size=1024, num_workers=2, cache_dir=args.cache)
    planned = time.perf_counter() - wall
    dataset.load_state_dict(state)
    loaded = time.perf_counter() - wall
    first = next(iter(loader))
    total = time.perf_counter() - wall
    assert int(first["id"][0]) >= 0
    return {"plan_s": planned, "load_state_dict_s": loaded - planned, "first_batch_s": total - loaded, "total_s": total,
            "main_cpu_s": time.process_time() - cpu}  # fmt: skip


def step_object_store(args: argparse.Namespace) -> dict:
    """Planning on the S3 emulator (moto's server, tests/servers.py) with ``LATENCY_S`` added to
    every request (object reads, listings, HEADs), cold: no plan cache. The files (each a 10-row
    Parquet file) are uploaded once, in two prefixes, so that one upload gives two sizes: the
    first prefix alone, then both. Each size is planned ``--object-store-rounds`` times with each
    footer path of ``--footer-paths`` (``fsspec``: s3fs; ``arrow``: pyarrow's C++ client), the
    paths alternating. The emulator runs on the same machine: its CPU per file and per request is
    reported next to the client's."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    import servers  # noqa: E402

    from torch_dataloader_utils import StructuredDataset

    sizes = sorted({int(n) for n in args.object_store_files.split(",")})
    paths = args.footer_paths.split(",")
    store = servers.start_store("s3")
    server_pid = store.server._proc.pid
    try:
        sink = io.BytesIO()
        pq.write_table(pa.table({"id": list(range(10))}), sink)
        fs, blob, uploaded, results = store.fs, sink.getvalue(), 0, []
        started = time.perf_counter()
        for part, size in enumerate(sizes):
            fs.pipe({f"{servers.BUCKET}/many/p{part}/f{i:06d}.parquet": blob for i in range(size - uploaded)})
            uploaded = size
        upload_s = time.perf_counter() - started
        fs.invalidate_cache()
        faults = store.server.faults
        faults.inject("stall", -1, stall_seconds=LATENCY_S)
        faults.stall_metadata(seconds=LATENCY_S)
        for part, size in enumerate(sizes):
            urls = [store.url(f"many/p{p}") for p in range(part + 1)]
            for round_ in range(args.object_store_rounds):
                for path in paths:
                    os.environ["TDU_ARROW_FOOTERS"] = "1" if path == "arrow" else "0"
                    faults.reset_peak()
                    reads, heads = faults.counters()[1], faults.head_count()
                    server_cpu, wall, cpu = process_cpu_s(server_pid), time.perf_counter(), time.process_time()
                    dataset = StructuredDataset(urls, num_workers=0, storage_options=store.options)
                    wall, cpu, server_cpu = time.perf_counter() - wall, time.process_time() - cpu, process_cpu_s(server_pid) - server_cpu
                    requests = faults.counters()[1] - reads + faults.head_count() - heads  # GETs of objects and HEADs (listings not counted)
                    assert len(dataset.files) == size, len(dataset.files)
                    stats = dataset._catalog.fs.stats
                    assert (stats["fetcher_reads"] == size) == (path == "arrow"), stats
                    concurrency = dataset._catalog.fs.options.max_concurrency
                    results.append({
                        "files": size, "footer_path": path, "round": round_, "plan_s": wall, "client_cpu_s": cpu, "server_cpu_s": server_cpu,
                        "requests": requests, "client_cpu_ms_per_file": 1000 * cpu / size, "server_cpu_ms_per_file": 1000 * server_cpu / size,
                        "server_cpu_ms_per_request": 1000 * server_cpu / max(requests, 1), "peak_in_flight": faults.peak_in_flight(),
                        "latency_bound_s": requests * LATENCY_S / concurrency, "concurrency": concurrency,
                        "load_average": os.getloadavg(), "rss_planned_mb": rss_mb(),
                        "footers_pickled_bytes_per_file": len(pickle.dumps(dataset._catalog.footers)) / size,  # what a worker receives
                    })  # fmt: skip
                    print(json.dumps(results[-1]), file=sys.stderr, flush=True)
                    del dataset
    finally:
        store.server.stop()
    return {"latency_s": LATENCY_S, "upload_s": upload_s, "load_average": os.getloadavg(), "runs": results}


def step_million(args: argparse.Namespace) -> dict:
    """The compact state's file summary for 1,000,000 synthetic files (on paper: no files)."""
    from torch_dataloader_utils.state.compact import files_summary

    listing = [[f"/data/table/d{i // 1000:04d}/part-{i % 1000:05d}.parquet", 1300 + i % 97, f"mtime:{1.7e9 + i:.6f}"] for i in range(1_000_000)]
    started = time.process_time()
    summary = files_summary(listing)
    return {"files": len(listing), "summary_bytes": len(json.dumps(summary)), "groups": len(summary["groups"]), "cpu_s": time.process_time() - started}


STEPS = {"plan": step_plan, "epoch": step_epoch, "resume": step_resume, "object_store": step_object_store, "million": step_million}


def run_step(name: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--step", name, "--dir", args.dir, "--cache", args.cache, "--state", args.state,
               "--object-store-files", args.object_store_files, "--object-store-rounds", str(args.object_store_rounds),
               "--footer-paths", args.footer_paths]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"step {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "tdu-many-files"))
    parser.add_argument("--dirs", type=int, default=100)
    parser.add_argument("--files-per-dir", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--object-store-files", default="2000,10000", help="file counts planned on the S3 emulator, comma-separated (0: skip the step)")
    parser.add_argument("--object-store-rounds", type=int, default=1, help="plannings of each size per footer path")
    parser.add_argument("--footer-paths", default="fsspec,arrow", help="footer read paths compared on the S3 emulator, alternating: fsspec, arrow")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--step", choices=sorted(STEPS), help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        print(json.dumps(STEPS[args.step](args)))
        return
    work = tempfile.mkdtemp(prefix="tdu-many-files-")
    args.cache, args.state = os.path.join(work, "cache"), os.path.join(work, "state.json")
    try:
        results: dict[str, Any] = {"generate_s": generate(args.dir, args.dirs, args.files_per_dir, args.rows), "load_average": os.getloadavg()}
        results["plan_cold"] = run_step("plan", args)
        results["plan_warm"] = run_step("plan", args)
        results["epoch"] = run_step("epoch", args)
        results["resume"] = run_step("resume", args)
        if args.object_store_files != "0":
            results["object_store"] = run_step("object_store", args)
        results["million"] = run_step("million", args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(results)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as out:
            out.write(text)


def print_table(r: dict) -> None:
    cold, warm, epoch, resume = r["plan_cold"], r["plan_warm"], r["epoch"], r["resume"]
    rows = [
        ("files", f"{cold['files']:,}"),
        ("planning cold: wall / CPU s", f"{cold['wall_s']:.1f} / {cold['cpu_s']:.1f}"),
        ("planning warm (plan cache): wall / CPU s", f"{warm['wall_s']:.1f} / {warm['cpu_s']:.1f}"),
        ("RSS after import / after planning (warm) / peak cold, MB", f"{warm['rss_import_mb']:.0f} / {warm['rss_planned_mb']:.0f} / {cold['peak_mb']:.0f}"),
        *((f"state at {k}: KB ({v['form']})", f"{v['bytes'] / 1024:.0f}" + (f", taken in {v['take_ms']:.0f} ms" if "take_ms" in v else "")) for k, v in epoch["states"].items()),
        ("resume: plan + load_state_dict + first batch, s", f"{resume['plan_s']:.1f} + {resume['load_state_dict_s']:.2f} + {resume['first_batch_s']:.2f} = {resume['total_s']:.1f} (main CPU {resume['main_cpu_s']:.1f})"),
        ("epoch rows/s (2 workers, wall)", f"{epoch['rows_per_s']:,.0f}"),
        ("files per worker CPU-second / per worker per wall second", f"{epoch['files_per_worker_cpu_s']:,.0f} / {epoch['files_per_s_per_worker_wall']:,.0f}"),
    ]  # fmt: skip
    if "object_store" in r:
        for o in r["object_store"]["runs"]:
            rows.append((
                f"S3 emulator, 30 ms per request: plan {o['files']:,} files cold ({o['footer_path']}), s (client / emulator CPU ms per file)",
                f"{o['plan_s']:.1f} ({o['client_cpu_ms_per_file']:.2f} / {o['server_cpu_ms_per_file']:.2f}; latency bound {o['latency_bound_s']:.1f} s)",
            ))  # fmt: skip
    m = r["million"]
    rows.append(("1M files (synthetic): compact file summary, KB", f"{m['summary_bytes'] / 1024:.0f} ({m['groups']} groups, {m['cpu_s']:.1f} s CPU)"))
    print(f"load average at start: {', '.join(f'{x:.1f}' for x in r['load_average'])}")
    print("| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
