"""CPU seconds and memory of other processes, read from /proc (Linux): the emulators' and workers'
cost that the benchmarks report beside their own, and a process tree's peak memory."""

from __future__ import annotations

import os
import threading
import time
from typing import Any


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


class RssSampler:
    """Samples the memory of this process's children (the DataLoader workers) from /proc.

    ``private`` is RssAnon + RssShmem (heap, Arrow buffers, tensors in shared memory);
    library code pages (RssFile) are shared by all processes and left out. ``hwm`` is
    the kernel's peak RSS (all kinds) for comparison.
    """

    def __init__(self, interval: float = 0.01):
        self.interval = interval
        self.first: dict[int, dict[str, int]] = {}
        self.peak: dict[int, dict[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.is_set():
            for child in me.children(recursive=True):
                status = _status(child.pid)
                if status is None:
                    continue
                self.first.setdefault(child.pid, status)
                peak = self.peak.setdefault(child.pid, dict(status))
                for key, value in status.items():
                    peak[key] = max(peak[key], value)
            time.sleep(self.interval)

    def summary(self) -> dict[str, float]:
        """Largest peak growth over the first sample among workers (MiB)."""
        if not self.peak:
            return {"worker_private_growth_mib": float("nan"), "worker_hwm_growth_mib": float("nan")}
        mib = 2**20
        return {
            "worker_private_growth_mib": max(self.peak[p]["private"] - self.first[p]["private"] for p in self.peak) / mib,
            "worker_hwm_growth_mib": max(self.peak[p]["hwm"] - self.first[p]["rss"] for p in self.peak) / mib,
            "worker_peak_rss_mib": max(self.peak[p]["hwm"] for p in self.peak) / mib,
        }


def _status(pid: int) -> dict[str, int] | None:
    """rss, hwm and private (RssAnon + RssShmem) in bytes from /proc, or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssShmem"):
            values[key] = int(value.split()[0]) * 1024
    if len(values) < 4:
        return None
    return {"rss": values["VmRSS"], "hwm": values["VmHWM"], "private": values["RssAnon"] + values["RssShmem"]}
