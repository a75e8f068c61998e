"""The benchmark scripts start and parse their documented options; generate.py writes exactly the files asked for;
run.py's targets report and resume-ratio interval, on fixed figures.

(The measurements themselves run by hand: docs/performance.md, docs/object-stores.md, docs/shuffling.md.)
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")
SCRIPTS = ["run.py", "generate.py", "native_profile.py", "object_stores.py", "shuffle_quality.py", "stateful_overhead.py"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_starts_and_documents_its_options(script):
    result = _run(os.path.join(BENCHMARKS, script), "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage:")


def test_generate_writes_exactly_the_files_asked_for(tmp_path):
    generate = os.path.join(BENCHMARKS, "generate.py")
    # the same rows per file, fewer files: the second run reuses part-00000 and must not leave part-00001
    assert _run(generate, str(tmp_path), "--size-gb", "0.0004", "--files", "2").returncode == 0
    assert _run(generate, str(tmp_path), "--size-gb", "0.0002", "--files", "1").returncode == 0
    assert sorted(name for name in os.listdir(tmp_path) if name.startswith("part-")) == ["part-00000.parquet"]


def _contender(rows_per_s: float, first: float, pss: float, resumes: dict) -> dict:
    return {"epoch": {"rows_per_s": rows_per_s, "first_batch_s": first, "peak_pss_mib": pss}, "resumes": resumes}


def _resume(first: float, duplicated: int = 0, lost: int = 0, **paired: object) -> dict:
    return {"first_batch_s": first, "duplicated": duplicated, "lost": lost, **paired}


def _import_run():
    sys.path.insert(0, BENCHMARKS)
    try:
        import run
    finally:
        sys.path.remove(BENCHMARKS)
    return run


def test_resume_ratio_interval_draws_the_pairs_again():
    run = _import_run()
    fresh = [0.050, 0.052, 0.048, 0.070, 0.051, 0.049, 0.055]
    assert run.ratio_interval([1.2 * f for f in fresh], fresh) == pytest.approx([1.2, 1.2])  # every draw: the same ratio
    resumed = [0.056, 0.061, 0.058, 0.064, 0.090, 0.057, 0.059]
    low, high = run.ratio_interval(resumed, fresh)
    point = float(np.median(resumed) / np.median(fresh))
    assert low < point < high
    assert run.ratio_interval(resumed, fresh) == [low, high]  # seeded
    narrow = run.ratio_interval(resumed, fresh, level=0.5)
    assert low <= narrow[0] <= narrow[1] <= high and narrow != [low, high]


def test_run_reports_each_target_and_where_a_peer_won():
    run = _import_run()
    ours = _contender(
        850_000, 0.05, 450, {"0.1": _resume(0.05), "0.5": _resume(0.06, lost=3), "0.9": _resume(0.07, vs_fresh=1.3, vs_fresh_interval=[1.1, 1.45], first_batch_samples=[0.07] * 5)}
    )
    ours["vs_ceiling"] = 0.85
    peer = _contender(300_000, 0.10, 400, {"0.1": _resume(0.04), "0.5": _resume(0.09), "0.9": _resume(0.08)})
    results = {
        "measurements": {"numeric": {"a_ceiling": _contender(1e6, 0.05, 400, {}), "b_handwritten": peer, "d_this_library": ours}},
        "rss_scaling": {"1x": {"peak_pss_mib": 500.0}, "4x": {"peak_pss_mib": 520.0}},
    }
    lines = run.target_lines(results)
    assert "MISSED: numeric rows/s >= 0.90x the ceiling's: 0.85x" in lines
    assert "MISSED: numeric first batch after resuming at 90% <= 1.2x a fresh start's: 1.30x (90% bootstrap interval 1.10–1.45 over 5 pairs)" in lines
    assert "MISSED: numeric 0 rows duplicated and 0 lost across the resumes: {'0.5': (0, 3)}" in lines
    assert "met: peak PSS on 4x the data <= 1.1x that on 1x: 1.04x" in lines
    wins = lines[-1]
    assert wins.startswith("faster than (b) and (c) everywhere: no")
    assert "first batch s after resuming at 10%: 0.040 against (d)'s 0.050" in wins
    assert "peak PSS MiB: 400 against (d)'s 450" in wins
    assert "rows/s" not in wins and "at 90%" not in wins and "at 50%" not in wins
    del results["measurements"]["numeric"]["b_handwritten"]  # a run without peers says nothing about them
    assert not [line for line in run.target_lines(results) if line.startswith("faster than")]
