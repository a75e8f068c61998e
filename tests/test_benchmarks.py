"""The benchmark scripts start and parse their documented options; generate.py writes exactly the files asked for.

(The measurements themselves run by hand: docs/performance.md, docs/object-stores.md, docs/shuffling.md.)
"""

from __future__ import annotations

import os
import subprocess
import sys

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
