"""Throughput and resume benchmark: the contenders of contenders.py (this library with worker
processes and with reader threads among them) and an ideal feeder on the same files, side by side.

    python benchmarks/run.py [--size-gb 0.25] [--num-workers 2] [--batch-size 1024] [--name run]

Every batch is read, as a training step reads it (consume.py: every byte once, in the training
loop's thread; the ceiling reads in the processes that decode). Each contender also runs epochs
whose batches nobody reads (the "untouched" figures; --no-untouched skips them). The ideal
feeder hands over batches decoded before the clock started, in ordinary memory: the most a
training loop can get, and the main-thread CPU per batch that (d)'s is held to.

Every measurement runs in a new process (a resume too), while this process samples the
RSS and PSS of that process and all its children. Prints a markdown table; writes JSON to
benchmarks/results/<name>.json. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from consume import read_batch  # noqa: E402
from contenders import CONTENDERS, REFERENCES, TOUCHED_ONLY  # noqa: E402
from generate import ROW_BYTES, ensure_dataset, rows_for  # noqa: E402
from proc_stats import TreeMemory  # noqa: E402
from report import FRACTIONS, PEAKS, PEERS, TIMED_FRACTION, paired_ratios, peaks, ratio_interval, summarize, table, target_lines  # noqa: E402, F401 - run's report

COLUMN_SETS = {"numeric": ["id", "label", "feat"], "text": ["id", "label", "feat", "text"]}
SAMPLE_SECONDS = 0.05  # memory sampling period
FILES = 8
NO_RESUME = ("a_ceiling", "i_ideal_feeder")  # no resume state
COLUMN_BYTES = {"id": 8, "label": 4, "feat": 256, "text": ROW_BYTES - 268}  # decoded bytes per row


def _read_once(paths: list[str]) -> None:
    """Read every file once, so that the measurement that follows does not pay disk reads.

    Done before every measurement, not once per run: on the development machine the kernel
    drops page-cache pages that were not read for a while, even with 22 GiB free (a DAMON
    kdamond runs there). Measured: 5% of a file read 45 s before was gone, and minutes after a
    1 GiB run most of its files were out of the cache. Cold files read at 0.4 to 0.8 GB/s there,
    cached ones at ~8 GB/s (0.08 s for the 1 GiB set's 8 files)."""
    for path in paths:
        with open(path, "rb") as file:
            while file.read(1 << 24):
                pass


# ------------------------------------------------------------ child process
def _cpu_seconds() -> np.ndarray:
    """CPU time of this process and of its reaped children (the loader's workers)."""
    t = os.times()
    return np.array([t.user + t.system, t.children_user + t.children_system])


def batch_rows(batch: Any) -> int:
    return batch if isinstance(batch, int) else len(batch["id"])


def _thread_faults() -> int:
    """Page faults (minor and major) of the calling thread so far."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_minflt + usage.ru_majflt


def child(spec: dict) -> dict:
    """One epoch (fresh, saving states at FRACTIONS) or the rest of one after a resume, every
    batch read by ``consume.read_batch`` unless ``spec["touch"]`` is False (the ceiling reads in
    its own processes instead: READS_IN_WORKERS). The main thread's CPU time (``thread_time``) and
    page faults are taken around the loop, less the ids kept and the states saved for the resume
    checks; torch runs one thread here, so that the reads are all on the thread measured."""
    from contenders import IMPORTS, PREPARES, READS_IN_WORKERS, WARMUPS, Config

    for module in IMPORTS.get(spec["contender"], ()):  # imports are not part of the first-batch time
        importlib.import_module(module)
    torch.set_num_threads(1)
    cfg = Config(**spec["config"])
    if spec["contender"] in WARMUPS:
        WARMUPS[spec["contender"]](cfg)
    if spec.get("sharing_strategy"):
        from torch import multiprocessing

        multiprocessing.set_sharing_strategy(spec["sharing_strategy"])
    state = None
    if spec.get("resume_from"):
        with open(spec["resume_from"], "rb") as f:
            state = pickle.load(f)
    touch = spec.get("touch", True)
    options = dict(spec.get("options", {}))
    if spec["contender"] in READS_IN_WORKERS:
        options["touch"] = touch
    if spec["contender"] in PREPARES:
        options["prepared"] = PREPARES[spec["contender"]](cfg)
    consume = read_batch if touch and spec["contender"] not in READS_IN_WORKERS else None
    save_at = [int(f * spec["total_rows"]) for f in spec.get("save_fractions", [])]
    ids: list[np.ndarray] = []
    saved: list[int] = []
    rows = count = 0
    aside = 0.0  # main-thread CPU of the resume checks' bookkeeping, not the training loop's
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    batches, save_state = {**CONTENDERS, **REFERENCES}[spec["contender"]](cfg, state, **options)
    started = time.perf_counter()
    first = None
    thread0, faults0 = time.thread_time(), _thread_faults()
    thread_first = faults_first = None
    for batch in batches:  # iter() starts the worker processes
        if first is None:
            first = time.perf_counter()
            thread_first, faults_first = time.thread_time(), _thread_faults()
            if spec.get("first_batch_only"):
                break
        if consume is not None and not isinstance(batch, int):  # an int: a row count, nothing to read
            consume(batch)
        count += 1
        rows += batch_rows(batch)
        if spec["collect_ids"] or save_at:
            mark = time.thread_time()
            if spec["collect_ids"] and not isinstance(batch, int):
                ids.append(batch["id"].numpy().copy())
            while len(saved) < len(save_at) and rows >= save_at[len(saved)]:
                with open(f"{spec['work']}.state{len(saved)}", "wb") as f:
                    pickle.dump(save_state(), f)
                saved.append(rows)
            aside += time.thread_time() - mark
    end, thread_end = time.perf_counter(), time.thread_time()
    thread_cpu, faults = thread_end - thread0 - aside, _thread_faults() - faults0
    cpu = _cpu_seconds() - cpu0  # the workers have ended with the epoch and were reaped
    if spec["collect_ids"]:
        np.save(spec["work"] + ".ids.npy", np.concatenate(ids) if ids else np.zeros(0, np.int64))
    if first is None:  # nothing delivered
        first, thread_first, faults_first = end, thread_end, faults0
    return {
        "rows": rows,
        "batches": count,
        "saved_rows": saved,
        "first_batch_s": first - t0,
        "epoch_s": end - t0,
        "setup_s": started - t0,
        "cpu_s": float(cpu.sum()),
        "cpu_main_s": float(cpu[0]),
        "rows_per_s": rows / (end - t0),  # from creating the loader (planning included), for every contender
        # the training loop's thread, from iter() to the end of the epoch, and from the first batch's arrival on
        "thread_cpu_s": thread_cpu,
        "cpu_us_per_batch": 1e6 * thread_cpu / max(count, 1),
        "cpu_us_per_batch_after_first": 1e6 * (thread_end - thread_first - aside) / max(count - 1, 1),
        "faults_per_batch": faults / max(count, 1),
        "first_batch_thread_cpu_s": thread_first - thread0,
        "first_batch_faults": faults_first - faults0,
    }


# ----------------------------------------------------------- parent process
def child_command(spec: dict) -> tuple[list[str], dict[str, str], str]:
    """Command line and environment that run ``spec`` in a new process, and the spec's file
    (the caller deletes it)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    return [sys.executable, os.path.abspath(__file__), "--child", f.name], {**os.environ, "PYTHONWARNINGS": "ignore"}, f.name


def run_child(spec: dict, timeout: float, sample_memory: bool = True) -> dict:
    """Run one measurement in a new process, its files read just before (``_read_once``),
    sampling its process tree's memory unless ``sample_memory`` is False (each sample reads
    every process's smaps_rollup: about 5.5 ms of CPU with 3 processes, not worth paying in runs
    whose memory is not reported)."""
    import psutil

    _read_once(spec["config"]["files"])
    command, env, spec_file = child_command(spec)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, env=env)
    memory, done = TreeMemory(psutil.Process(proc.pid)), threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_SECONDS):
            try:
                memory.sample()
            except psutil.Error:
                pass

    if sample_memory:
        threading.Thread(target=sample, daemon=True).start()
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        done.set()
        proc.kill()
        os.unlink(spec_file)
    if proc.returncode != 0:
        raise RuntimeError(f"{spec['contender']} failed (exit {proc.returncode})")
    result = json.loads(out.decode().strip().splitlines()[-1])
    if sample_memory:
        result["peak_rss_mib"], result["peak_pss_mib"] = memory.rss / 2**20, memory.pss / 2**20
        result["high_water_rss_mib"] = memory.high_water / 2**20
    return result


def resume_check(epoch_ids: np.ndarray, before: int, after: np.ndarray, total: int) -> dict:
    """Rows duplicated and lost when the first ``before`` rows came from the uninterrupted run."""
    seen = np.concatenate([epoch_ids[:before], after])
    unique = len(np.unique(seen))
    return {
        "duplicated": int(len(seen) - unique),
        "lost": int(total - unique),
        "same_order": bool(np.array_equal(after, epoch_ids[before:])),
    }


def fresh_epoch(contender: str, cfg: dict, total: int, work: str, resumes: bool, timeout: float, extra: dict, sample_memory: bool = False) -> dict:
    """One uninterrupted epoch; ``resumes`` also saves states at FRACTIONS and keeps the delivered ids.
    Timed epochs run without the memory sampler, which takes CPU from the contender on a small
    machine (on 2 cores it slowed epochs by 11-18%, the ceiling's most)."""
    spec = {"contender": contender, "config": cfg, "total_rows": total, "work": work, **extra}
    return run_child({**spec, "collect_ids": resumes, "save_fractions": FRACTIONS if resumes else []}, timeout, sample_memory)


def resume_runs(contender: str, cfg: dict, total: int, work: str, fresh: dict, timeout: float, extra: dict, pairs: int) -> dict:
    """New processes loading the states ``fresh`` saved at FRACTIONS, each running to the end of
    the epoch (rows duplicated and lost). The 90% point, which has a target, is also timed in
    ``pairs`` pairs of new processes that stop at the first batch, a fresh start and then a resume,
    so that both halves of the ratio see the same moment's load (single starts vary by ±50 ms on
    a shared host: three unpaired samples each once gave 1.48x where nine paired gave 1.06x).
    Their memory is not reported, so they run without the memory sampler."""
    spec = {"contender": contender, "config": cfg, "total_rows": total, "work": work, **extra}
    ids = np.load(work + ".ids.npy")
    out: dict[str, dict] = {}
    for i, fraction in enumerate(FRACTIONS):
        state = f"{work}.state{i}"
        resumed = run_child({**spec, "collect_ids": True, "resume_from": state}, timeout)
        check = resume_check(ids, fresh["saved_rows"][i], np.load(work + ".ids.npy"), total)
        out[str(fraction)] = {**resumed, **check}
        if fraction == TIMED_FRACTION and pairs:
            first_only = {**spec, "collect_ids": False, "first_batch_only": True}
            fresh_samples, samples = [], []
            for _ in range(pairs):
                fresh_samples.append(run_child(first_only, timeout, sample_memory=False)["first_batch_s"])
                samples.append(run_child({**first_only, "resume_from": state}, timeout, sample_memory=False)["first_batch_s"])
            out[str(fraction)].update(
                first_batch_samples=samples,
                fresh_first_batch_samples=fresh_samples,
                first_batch_s=float(np.median(samples)),
                vs_fresh=float(np.median(samples) / np.median(fresh_samples)),
                vs_fresh_pairwise=float(np.median(np.array(samples) / np.array(fresh_samples))),
                vs_fresh_interval=ratio_interval(samples, fresh_samples),
            )
    return out


def rss_scaling(cfg: dict, files_4x: list[str], work: str, timeout: float, extra: dict, repeat: int) -> dict:
    """Peak memory of the library's epoch on 1x and 4x the data (ids not collected), the median
    over ``repeat`` interleaved runs of each."""
    runs: dict[str, list[dict]] = {"1x": [], "4x": []}
    for _ in range(repeat):
        for label, files in (("1x", cfg["files"]), ("4x", files_4x)):
            spec = {"contender": "d_this_library", "config": {**cfg, "files": files}, "total_rows": 0, "work": work, "collect_ids": False, **extra}
            runs[label].append(run_child(spec, timeout))
    return {label: {key: float(np.median([r[key] for r in rs])) for key in PEAKS} | {"runs": rs} for label, rs in runs.items()}


def fixed_costs(cfg: dict, timeout: float, extra: dict, repeat: int) -> dict:
    """An epoch with nothing to read, the median of ``repeat`` interleaved runs of each: the
    ceiling's bare processes and a bare torch DataLoader, with the same number of workers."""
    runs: dict[str, list[dict]] = {name: [] for name in REFERENCES}
    for _ in range(repeat):
        for name in REFERENCES:
            spec = {"contender": name, "config": cfg, "total_rows": 0, "work": "", "collect_ids": False, **extra}
            runs[name].append(run_child(spec, timeout, sample_memory=False))
    return {name: {key: float(np.median([r[key] for r in rs])) for key in ("epoch_s", "first_batch_s", "cpu_s")} for name, rs in runs.items()}


# ----------------------------------------------------------- command line
def contender_names(text: str) -> list[str]:
    """``a,d,e`` or ``a_ceiling,d_this_library``: the contenders' full names, in the order given."""
    names = []
    for given in text.split(","):
        matches = [n for n in CONTENDERS if given.strip() in (n, n.split("_")[0])]
        if not matches:
            raise argparse.ArgumentTypeError(f"unknown contender {given!r}; choose from {', '.join(CONTENDERS)} (or their letters)")
        names.append(matches[0])
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=0.25, help="decoded size of the dataset (GiB); the 4x set is 4 times that")
    parser.add_argument("--row-group-rows", type=int, default=65536)
    parser.add_argument("--no-page-index", action="store_true", help="write the Parquet files without a page index")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--contenders", type=contender_names, default=list(CONTENDERS), help="names or their letters: a,d,e")
    parser.add_argument("--columns", default=",".join(COLUMN_SETS), help="column sets: numeric,text")
    parser.add_argument("--repeat", type=int, default=3, help="epochs of (a), (d) and (e) (interleaved); the table shows medians")
    parser.add_argument(
        "--peer-repeat", type=int, default=1, help="epochs of (b) and (c), 6x to 40x slower than (d) (the default run stays under 5 minutes)"
    )
    parser.add_argument(
        "--resume-pairs", type=int, default=5, help="pairs of first batches (fresh, then resumed at 90%%) timed for (d)'s resume ratio; peers: --peer-repeat"
    )
    parser.add_argument("--no-resume", action="store_true", help="skip the resume measurements")
    parser.add_argument("--no-untouched", action="store_true", help="skip the epochs whose batches nobody reads (the \"untouched\" figures)")
    parser.add_argument("--no-rss-scaling", action="store_true", help="skip the 1x vs 4x RSS runs")
    parser.add_argument("--no-fixed-costs", action="store_true", help="skip the epochs with nothing to read")
    parser.add_argument("--options", default="{}", help="JSON keyword arguments for create_dataloader in (d)")
    parser.add_argument("--sharing-strategy", choices=["file_descriptor", "file_system"], help="torch.multiprocessing's, for every contender")
    parser.add_argument("--data-dir", default=os.path.join(HERE, "results", "data"))
    parser.add_argument("--name", default="run")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)

    rows = rows_for(args.size_gb, FILES)
    scaling = not args.no_rss_scaling
    data = os.path.join(args.data_dir, f"rows{rows}-rg{args.row_group_rows}" + ("-nopi" if args.no_page_index else ""))
    log(f"data: {FILES * (4 if scaling else 1)} files x {rows} rows in {data}")
    files = ensure_dataset(data, FILES * (4 if scaling else 1), rows, args.row_group_rows, page_index=not args.no_page_index)
    total = FILES * rows
    work = os.path.join(HERE, "results", "work", args.name)
    os.makedirs(os.path.dirname(work), exist_ok=True)
    results: dict[str, Any] = {
        "args": vars(args),
        "rows": total,
        "row_bytes": {k: sum(COLUMN_BYTES[c] for c in v) for k, v in COLUMN_SETS.items()},
        "measurements": {},
    }
    options = json.loads(args.options)
    for colset in args.columns.split(","):
        cfg = {"files": files[:FILES], "columns": COLUMN_SETS[colset], "batch_size": args.batch_size, "num_workers": args.num_workers}
        names = args.contenders
        extras = {n: {"sharing_strategy": args.sharing_strategy, "options": options if n == "d_this_library" else {}} for n in names}
        epochs: dict[str, list[dict]] = {n: [] for n in names}
        untouched: dict[str, list[dict]] = {n: [] for n in names}
        repeats = {n: args.peer_repeat if n in PEERS else args.repeat for n in names}
        per = results["measurements"][colset] = {}
        for repeat in range(max(repeats.values())):  # interleaved, so that load from other jobs hits every contender alike
            for name in [n for n in names if repeat < repeats[n]]:
                log(f"{colset}: {name} epoch {repeat + 1}/{repeats[name]}")
                resumes = repeat == 0 and not args.no_resume and name not in NO_RESUME
                epochs[name].append(fresh_epoch(name, cfg, total, f"{work}.{name}", resumes, args.timeout, extras[name]))
                if not args.no_untouched and name not in TOUCHED_ONLY:
                    log(f"{colset}: {name} epoch {repeat + 1}/{repeats[name]}, untouched")
                    untouched[name].append(fresh_epoch(name, cfg, total, "", False, args.timeout, {**extras[name], "touch": False}))
        for name in names:
            log(f"{colset}: {name} memory epoch")
            memory = fresh_epoch(name, cfg, total, "", False, args.timeout, extras[name], sample_memory=True)
            first = epochs[name][0]
            per[name] = {"epoch": summarize(epochs[name]) | peaks(memory), "epochs": epochs[name], "memory_epoch": memory, "resumes": {}}
            if untouched[name]:
                per[name]["untouched"] = summarize(untouched[name])
                per[name]["untouched_epochs"] = untouched[name]
            if first.get("saved_rows") and len(first["saved_rows"]) == len(FRACTIONS):
                log(f"{colset}: {name} resumes")
                ids = np.load(f"{work}.{name}.ids.npy")
                per[name]["epoch_check"] = resume_check(ids, 0, ids, total)
                pairs = args.peer_repeat if name in PEERS else args.resume_pairs
                per[name]["resumes"] = resume_runs(name, cfg, total, f"{work}.{name}", first, args.timeout, extras[name], pairs)
        paired_ratios(per, epochs, untouched)
    if not args.no_fixed_costs:
        log("fixed costs: epochs with nothing to read")
        cfg = {"files": files[:FILES], "columns": COLUMN_SETS["numeric"], "batch_size": args.batch_size, "num_workers": args.num_workers}
        results["fixed_costs"] = fixed_costs(cfg, args.timeout, {"sharing_strategy": args.sharing_strategy}, args.repeat)
    if scaling:
        log("rss scaling: d_this_library on 1x and 4x")
        cfg = {"files": files[:FILES], "columns": COLUMN_SETS["text"], "batch_size": args.batch_size, "num_workers": args.num_workers}
        extra = {"sharing_strategy": args.sharing_strategy, "options": options}
        results["rss_scaling"] = rss_scaling(cfg, files, work, args.timeout, extra, args.repeat)
    path = os.path.join(HERE, "results", f"{args.name}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(table(results))
    print("\nTargets (issue #28; rows/s with every batch read, unless untouched):\n" + "\n".join(f"- {line}" for line in target_lines(results)))
    log(f"wrote {path}")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        with open(sys.argv[2]) as spec_file:
            print(json.dumps(child(json.load(spec_file))))
    else:
        main()
