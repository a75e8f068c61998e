"""CPU seconds of another process, read from /proc (Linux): the emulators' and workers' cost
that the benchmarks report beside their own."""

from __future__ import annotations

import os


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
