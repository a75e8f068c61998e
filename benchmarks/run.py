"""Throughput and resume benchmark: four contenders and an ideal feeder on the same files, side by side.

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
from contenders import CONTENDERS, LABELS, REFERENCES, TOUCHED_ONLY  # noqa: E402
from generate import ROW_BYTES, ensure_dataset, rows_for  # noqa: E402

COLUMN_SETS = {"numeric": ["id", "label", "feat"], "text": ["id", "label", "feat", "text"]}
FRACTIONS = (0.1, 0.5, 0.9)
TIMED_FRACTION = 0.9  # timed in --resume-pairs pairs with fresh starts (the target: within 1.2x of a fresh start)
SAMPLE_SECONDS = 0.05  # memory sampling period
FILES = 8
PEERS = ("b_handwritten", "c_hf_datasets")  # measured --peer-repeat times
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
def _process_memory(pid: int) -> tuple[int, int, int]:
    """(RSS, PSS, peak RSS) of one process, from /proc (cheap reads, so sampling can be frequent).
    The peak RSS (VmHWM) is the kernel's own high-water mark: exact, whatever the sampling."""
    values = {}
    for name in ("smaps_rollup", "status"):
        with open(f"/proc/{pid}/{name}") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss", "VmHWM"):
                    values[key] = int(rest.split()[0]) * 1024
    return values["Rss"], values["Pss"], values["VmHWM"]


class TreeMemory:
    """Peaks of a process tree's memory: RSS and PSS summed over the tree at each sample, and
    every process's own peak RSS (the kernel's high-water mark) summed over the processes seen."""

    def __init__(self, root: Any):
        self.root = root
        self.rss = self.pss = 0
        self._high_water: dict[int, int] = {}

    def sample(self) -> None:
        rss = pss = 0
        for p in [self.root] + self.root.children(recursive=True):
            try:
                one = _process_memory(p.pid)
            except (OSError, KeyError):
                continue
            rss, pss = rss + one[0], pss + one[1]
            self._high_water[p.pid] = max(self._high_water.get(p.pid, 0), one[2])
        self.rss, self.pss = max(self.rss, rss), max(self.pss, pss)

    @property
    def high_water(self) -> int:
        return sum(self._high_water.values())


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


def fresh_epoch(contender: str, cfg: dict, total: int, work: str, resumes: bool, timeout: float, extra: dict) -> dict:
    """One uninterrupted epoch; ``resumes`` also saves states at FRACTIONS and keeps the delivered ids."""
    spec = {"contender": contender, "config": cfg, "total_rows": total, "work": work, **extra}
    return run_child({**spec, "collect_ids": resumes, "save_fractions": FRACTIONS if resumes else []}, timeout)


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


def ratio_interval(resumed: list[float], fresh: list[float], level: float = 0.9, rounds: int = 2000) -> list[float]:
    """A bootstrap interval (``level``, percentiles) for median(resumed) / median(fresh): the
    pairs are drawn again with replacement ``rounds`` times (seeded: the same samples give the
    same interval). Five pairs give a wide one; see --resume-pairs."""
    resumed_a, fresh_a = np.asarray(resumed, dtype=float), np.asarray(fresh, dtype=float)
    draws = np.random.default_rng(0).integers(0, len(resumed_a), size=(rounds, len(resumed_a)))
    ratios = np.median(resumed_a[draws], axis=1) / np.median(fresh_a[draws], axis=1)
    tail = 50 * (1 - level)
    return [float(np.percentile(ratios, tail)), float(np.percentile(ratios, 100 - tail))]


def _paired(mine: list[dict], theirs: list[dict], key: str) -> list[float]:
    return [m[key] / t[key] for m, t in zip(mine, theirs)]


def paired_ratios(per: dict, epochs: dict[str, list[dict]], untouched: dict[str, list[dict]]) -> None:
    """Each contender's rows/s over the ceiling's, touched over touched and untouched over
    untouched, and its main-thread CPU per batch over the ideal feeder's: paired by round (the
    ratio measured next to it), the median and the range of the rounds' ratios."""
    for name, res in per.items():
        pairs = [("vs_ceiling", epochs[name], epochs.get("a_ceiling", []), "rows_per_s")]
        pairs.append(("vs_ceiling_untouched", untouched.get(name, []), untouched.get("a_ceiling", []), "rows_per_s"))
        if name not in ("a_ceiling", "i_ideal_feeder"):
            pairs.append(("cpu_vs_ideal", epochs[name], epochs.get("i_ideal_feeder", []), "cpu_us_per_batch"))
        for key, mine, theirs, figure in pairs:
            ratios = _paired(mine, theirs, figure)
            if ratios:
                res[key] = float(np.median(ratios))
                res[f"{key}_range"] = [float(min(ratios)), float(max(ratios))]


def summarize(epochs: list[dict]) -> dict:
    """The median of every figure over repeated epochs (peak memory: the maximum)."""
    out = {key: float(np.median([e[key] for e in epochs])) for key in epochs[0] if isinstance(epochs[0][key], (int, float))}
    for key in ("peak_rss_mib", "peak_pss_mib", "high_water_rss_mib"):
        out[key] = max(e[key] for e in epochs)
    return out


def rss_scaling(cfg: dict, files_4x: list[str], work: str, timeout: float, extra: dict, repeat: int) -> dict:
    """Peak memory of the library's epoch on 1x and 4x the data (ids not collected), the median
    over ``repeat`` interleaved runs of each."""
    runs: dict[str, list[dict]] = {"1x": [], "4x": []}
    for _ in range(repeat):
        for label, files in (("1x", cfg["files"]), ("4x", files_4x)):
            spec = {"contender": "d_this_library", "config": {**cfg, "files": files}, "total_rows": 0, "work": work, "collect_ids": False, **extra}
            runs[label].append(run_child(spec, timeout))
    keys = ("peak_rss_mib", "peak_pss_mib", "high_water_rss_mib")
    return {label: {key: float(np.median([r[key] for r in rs])) for key in keys} | {"runs": rs} for label, rs in runs.items()}


def fixed_costs(cfg: dict, timeout: float, extra: dict, repeat: int) -> dict:
    """An epoch with nothing to read, the median of ``repeat`` interleaved runs of each: the
    ceiling's bare processes and a bare torch DataLoader, with the same number of workers."""
    runs: dict[str, list[dict]] = {name: [] for name in REFERENCES}
    for _ in range(repeat):
        for name in REFERENCES:
            spec = {"contender": name, "config": cfg, "total_rows": 0, "work": "", "collect_ids": False, **extra}
            runs[name].append(run_child(spec, timeout))
    return {name: {key: float(np.median([r[key] for r in rs])) for key in ("epoch_s", "first_batch_s", "cpu_s")} for name, rs in runs.items()}


# ------------------------------------------------------------------ report
def _fmt_resume(entry: dict | None, key: str) -> str:
    if not entry:
        return "—"
    if key == "ttfb":
        return f"{entry['first_batch_s']:.2f}"
    return f"{entry['duplicated']}/{entry['lost']}"


def _ratio(res: dict, key: str) -> str:
    if key not in res:
        return "—"
    low, high = res.get(f"{key}_range", (res[key], res[key]))
    return f"{res[key]:.2f} ({low:.2f}–{high:.2f})" if high > low else f"{res[key]:.2f}"


def table(results: dict) -> str:
    """The markdown table: rows/s with every batch read (``touched``) unless the column says
    untouched; the training loop's main-thread CPU per batch, read included."""
    head = (
        "| contender | columns | rows/s | untouched rows/s | MB/s | vs (a) | untouched vs (a) | main-thread CPU µs/batch | "
        "page faults/batch | epoch s | CPU s | peak PSS MiB | first batch s | resume 10/50/90% first batch s | dup/lost 10% | 50% | 90% |"
    )
    lines = [head, "|" + "---|" * 17]
    for colset, per in results["measurements"].items():
        for name, res in per.items():
            e, r, u = res["epoch"], res["resumes"], res.get("untouched")
            ttfbs = "/".join(_fmt_resume(r.get(str(f)), "ttfb") for f in FRACTIONS) if r else "—"
            dups = [_fmt_resume(r.get(str(f)), "dup") for f in FRACTIONS]
            mbs = e["rows_per_s"] * results["row_bytes"][colset] / 1e6
            reads_in_main = name != "a_ceiling"  # the ceiling reads in its own processes
            cpu = f"{e['cpu_us_per_batch']:,.0f}" if reads_in_main and "cpu_us_per_batch" in e else "—"
            faults = f"{e['faults_per_batch']:,.1f}" if reads_in_main and "faults_per_batch" in e else "—"
            bare = f"{u['rows_per_s']:,.0f}" if u else "—"
            lines.append(
                f"| {LABELS[name]} | {colset} | {e['rows_per_s']:,.0f} | {bare} | {mbs:,.0f} | "
                f"{_ratio(res, 'vs_ceiling')} | {_ratio(res, 'vs_ceiling_untouched')} | {cpu} | {faults} | {e['epoch_s']:.1f} | {e['cpu_s']:.1f} | "
                f"{e['peak_pss_mib']:,.0f} | {e['first_batch_s']:.2f} | {ttfbs} | {' | '.join(dups)} |"
            )
    for colset, per in results["measurements"].items():
        ideal = per.get("i_ideal_feeder")
        for name, res in per.items():
            if ideal and "cpu_vs_ideal" in res:
                e, i = res["epoch"], ideal["epoch"]
                bare = f"; untouched {res['untouched']['cpu_us_per_batch']:,.0f} µs" if "untouched" in res else ""
                lines.append(
                    f"\n{LABELS[name]}, {colset}: main-thread CPU per batch (read included) / the ideal feeder's = "
                    f"{_ratio(res, 'cpu_vs_ideal')} ({e['cpu_us_per_batch']:,.0f} against {i['cpu_us_per_batch']:,.0f} µs, "
                    f"medians; from the first batch on {e['cpu_us_per_batch_after_first']:,.0f} against "
                    f"{i['cpu_us_per_batch_after_first']:,.0f} µs{bare}; page faults per batch {e['faults_per_batch']:.1f} "
                    f"against {i['faults_per_batch']:.1f})"
                )
    for colset, per in results["measurements"].items():
        for name, res in per.items():
            timed = res["resumes"].get(str(TIMED_FRACTION))
            if timed and "vs_fresh" in timed:
                lines.append(
                    f"\n{LABELS[name]}, {colset}: first batch after resuming at {TIMED_FRACTION:.0%} / fresh start = "
                    f"{timed['vs_fresh']:.2f} (medians of {len(timed['first_batch_samples'])} resumes, "
                    f"{1000 * timed['first_batch_s']:.0f} ms, and the fresh starts paired with them, "
                    f"{1000 * float(np.median(timed['fresh_first_batch_samples'])):.0f} ms; median of the pairs' ratios "
                    f"{timed['vs_fresh_pairwise']:.2f}; {_interval(timed)})"
                )
    fixed = results.get("fixed_costs")
    if fixed:
        bare, loader = fixed["x_bare_processes"], fixed["x_bare_dataloader"]
        lines.append(
            f"\nAn epoch with nothing to read (medians): the ceiling's bare processes {bare['epoch_s']:.3f} s, a bare torch "
            f"DataLoader with the same workers {loader['epoch_s']:.3f} s (first item {loader['first_batch_s']:.3f} s): "
            f"{loader['epoch_s'] - bare['epoch_s']:+.3f} s per epoch for any DataLoader-based contender"
        )
        for colset, per in results["measurements"].items():
            if "a_ceiling" in per and "d_this_library" in per:
                gap = per["d_this_library"]["epoch"]["epoch_s"] - per["a_ceiling"]["epoch"]["epoch_s"]
                lines.append(f"\n(d) epoch minus (a) epoch, {colset}: {gap:+.3f} s (medians)")
    rss = results.get("rss_scaling")
    if rss:
        labels = (("peak_pss_mib", "peak PSS of the tree"), ("peak_rss_mib", "peak RSS of the tree"), ("high_water_rss_mib", "per-process peak RSS, summed"))
        for key, label in labels:
            a, b = rss["1x"][key], rss["4x"][key]
            lines.append(f"\n(d) {label} (all columns, median of runs): {a:,.0f} MiB on 1x the data, {b:,.0f} MiB on 4x ({b / a:.2f}x)")
    return "\n".join(lines)


def _interval(timed: dict) -> str:
    low, high = timed["vs_fresh_interval"]
    return f"90% bootstrap interval {low:.2f}–{high:.2f} over {len(timed['first_batch_samples'])} pairs"


# issue #28's targets (issue #5's, with every batch read)
THROUGHPUT_TARGETS = {"numeric": 0.9, "text": 0.85}  # (d)'s rows/s over the ceiling's, every batch read by both
UNTOUCHED_TARGETS = {"numeric": 0.9, "text": 0.9}  # the same, nobody reading the batches
CPU_TARGET = 1.2  # (d)'s main-thread CPU per batch (read included) over the ideal feeder's
RESUME_TARGET = 1.2  # (d)'s first batch after resuming at 90% over a fresh start's
MEMORY_TARGET = 1.1  # (d)'s peak PSS on 4x the data over 1x


def _peer_wins(colset: str, per: dict) -> list[str]:
    """The cells where a peer ((b) or (c)) did better than (d): rows/s, first batch (fresh and
    resumed), peak PSS."""
    ours, wins = per["d_this_library"], []
    for peer in [p for p in PEERS if p in per]:
        theirs = per[peer]
        cells = [
            ("rows/s", ours["epoch"]["rows_per_s"], theirs["epoch"]["rows_per_s"], True),
            ("first batch s", ours["epoch"]["first_batch_s"], theirs["epoch"]["first_batch_s"], False),
            ("peak PSS MiB", ours["epoch"]["peak_pss_mib"], theirs["epoch"]["peak_pss_mib"], False),
        ]
        for fraction in FRACTIONS:
            mine, other = ours["resumes"].get(str(fraction)), theirs["resumes"].get(str(fraction))
            if mine and other:
                cells.append((f"first batch s after resuming at {fraction:.0%}", mine["first_batch_s"], other["first_batch_s"], False))
        for name, mine, other, higher_wins in cells:
            if (other > mine) if higher_wins else (other < mine):
                form = ".3f" if name.startswith("first batch") else ",.0f"
                wins.append(f"{LABELS[peer]}, {colset}, {name}: {other:{form}} against (d)'s {mine:{form}}")
    return wins


def target_lines(results: dict) -> list[str]:
    """Each of issue #28's targets with what this run measured, and where a peer beat (d).
    "rows/s" is with every batch read (by the training loop, and by the ceiling in its own
    processes); "untouched rows/s" with nobody reading them."""
    lines, wins = [], []
    for colset, per in results["measurements"].items():
        ours = per.get("d_this_library")
        if ours is None:
            continue
        target = THROUGHPUT_TARGETS.get(colset)
        if target is not None and "vs_ceiling" in ours:
            ratio = ours["vs_ceiling"]
            lines.append(f"{'met' if ratio >= target else 'MISSED'}: {colset} rows/s >= {target:.2f}x the ceiling's: {ratio:.2f}x")
        target = UNTOUCHED_TARGETS.get(colset)
        if target is not None and "vs_ceiling_untouched" in ours:
            ratio = ours["vs_ceiling_untouched"]
            lines.append(f"{'met' if ratio >= target else 'MISSED'}: {colset} untouched rows/s >= {target:.2f}x the untouched ceiling's: {ratio:.2f}x")
        ideal = per.get("i_ideal_feeder")
        if ideal and "cpu_vs_ideal" in ours:
            ratio = ours["cpu_vs_ideal"]
            lines.append(
                f"{'met' if ratio <= CPU_TARGET else 'MISSED'}: {colset} main-thread CPU per batch <= {CPU_TARGET}x the ideal feeder's: "
                f"{ratio:.2f}x ({ours['epoch']['cpu_us_per_batch']:,.0f} against {ideal['epoch']['cpu_us_per_batch']:,.0f} µs)"
            )
        timed = ours["resumes"].get(str(TIMED_FRACTION))
        if timed and "vs_fresh" in timed:
            ratio = timed["vs_fresh"]
            lines.append(
                f"{'met' if ratio <= RESUME_TARGET else 'MISSED'}: {colset} first batch after resuming at {TIMED_FRACTION:.0%} "
                f"<= {RESUME_TARGET}x a fresh start's: {ratio:.2f}x ({_interval(timed)})"
            )
        if ours["resumes"]:
            bad = {f: (r["duplicated"], r["lost"]) for f, r in ours["resumes"].items() if r["duplicated"] or r["lost"]}
            lines.append(f"{'MISSED' if bad else 'met'}: {colset} 0 rows duplicated and 0 lost across the resumes" + (f": {bad}" if bad else ""))
        wins += _peer_wins(colset, per)
    rss = results.get("rss_scaling")
    if rss:
        ratio = rss["4x"]["peak_pss_mib"] / rss["1x"]["peak_pss_mib"]
        lines.append(f"{'met' if ratio <= MEMORY_TARGET else 'MISSED'}: peak PSS on 4x the data <= {MEMORY_TARGET}x that on 1x: {ratio:.2f}x")
    if any("d_this_library" in per and any(peer in per for peer in PEERS) for per in results["measurements"].values()):
        lines.append("faster than (b) and (c) everywhere: " + ("yes" if not wins else "no; a peer did better in: " + "; ".join(wins)))
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=0.25, help="decoded size of the dataset (GiB); the 4x set is 4 times that")
    parser.add_argument("--row-group-rows", type=int, default=65536)
    parser.add_argument("--no-page-index", action="store_true", help="write the Parquet files without a page index")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--columns", default=",".join(COLUMN_SETS), help="column sets: numeric,text")
    parser.add_argument("--repeat", type=int, default=3, help="epochs of (a) and (d) (interleaved); the table shows medians")
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
        names = args.contenders.split(",")
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
            first = epochs[name][0]
            per[name] = {"epoch": summarize(epochs[name]), "epochs": epochs[name], "resumes": {}}
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
