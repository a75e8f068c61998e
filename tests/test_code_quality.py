"""The code's own rules, checked with every test run: the layering contract in pyproject.toml
(import-linter), the linter (ruff) and the type checker (mypy). Each runs as a command, as a
developer would run it, from the repository root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "src", "torch_dataloader_utils")


def run(*command: str) -> subprocess.CompletedProcess:
    executable = shutil.which(command[0])
    assert executable, f"{command[0]} is not installed: pip install -e '.[dev]'"
    return subprocess.run([executable, *command[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_layers_and_acyclic_modules():
    result = run("lint-imports")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff():
    result = run("ruff", "check", "src", "tests", "benchmarks", "examples")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_mypy():
    result = run("mypy")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_no_module_over_400_lines():
    """The package's modules, and the tests', benchmarks' and examples' too."""
    long = []
    for folder, _, files in (walked for top in (PACKAGE, *(os.path.join(ROOT, d) for d in ("tests", "benchmarks", "examples"))) for walked in os.walk(top)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    lines = sum(1 for _ in f)
                if lines > 400:
                    long.append(f"{os.path.relpath(path, ROOT)}: {lines} lines")
    assert not long, "split these modules by job: " + "; ".join(long)


def test_cli_help_does_not_import_torch_or_pyarrow():
    code = "import sys; from torch_dataloader_utils.cli import main; print('torch' in sys.modules, 'pyarrow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["False", "False"], result.stdout + result.stderr
