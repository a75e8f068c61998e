"""Many tiny files: planning cold and warm, state size, resume time, memory, rows/s.

    python benchmarks/many_files.py [--dir /tmp/tdu-many-files] [--dirs 100] [--files-per-dir 1000]
        [--rows 100] [--object-store-files 2000] [--json out.json]

Generates ``dirs x files_per_dir`` Parquet files of ``rows`` rows (``id`` int64, ``x`` float32;
once, kept under ``--dir``, marked complete by a hidden ``.complete`` file) and measures, each
step in a fresh process:

1. planning cold (no plan cache) and warm (the plan cache in a ``cache_dir``): wall and CPU
   seconds, RSS after importing the library and after planning, peak RSS;
2. one epoch with ``num_workers=2``: rows/s, the workers' CPU seconds (files per worker
   CPU-second), the size of ``state_dict()`` as JSON at 10, 50 and 90% of the epoch (the
   compact form ``auto`` picks, and the full form at 50% for comparison) and the time to take it;
3. resume: planning (warm) + ``load_state_dict`` of the 50% state + the first batch, wall and CPU;
4. planning ``--object-store-files`` files on the S3 emulator with 30 ms added to every object
   read (benchmarks/object_stores.py), extrapolated to 100,000 files;
5. 1,000,000 files on paper: the compact state's file summary of a synthetic 1M-file listing.

Wall seconds on a shared machine depend on its load: the CPU seconds of the measuring process
(and of the DataLoader workers) are reported next to them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


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
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    sys.path.insert(0, HERE)
    import servers  # noqa: E402
    from object_stores import _planning  # noqa: E402

    store = servers.start_store("s3")
    try:
        result = _planning(store, args.object_store_files, latency=0.03)
    finally:
        store.server.stop()
    result["extrapolated_100k_s"] = result["plan_s"] * 100_000 / args.object_store_files
    return result


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
               "--object-store-files", str(args.object_store_files)]  # fmt: skip
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
    parser.add_argument("--object-store-files", type=int, default=2000, help="0: skip the object-store step")
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
        if args.object_store_files:
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
        o = r["object_store"]
        rows.append((f"S3 emulator, 30 ms per read: plan {o['files']:,} files, s (extrapolated to 100k)", f"{o['plan_s']:.1f} ({o['extrapolated_100k_s']:.0f})"))
    m = r["million"]
    rows.append(("1M files (synthetic): compact file summary, KB", f"{m['summary_bytes'] / 1024:.0f} ({m['groups']} groups, {m['cpu_s']:.1f} s CPU)"))
    print(f"load average at start: {', '.join(f'{x:.1f}' for x in r['load_average'])}")
    print("| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
