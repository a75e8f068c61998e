"""The documentation: `mkdocs build --strict` passes and every code example in docs/*.md runs.

Conventions for examples (every page follows them):

- Every ```python block of a page runs, in page order, in ONE fresh interpreter
  (like a notebook), with the current directory set to an empty temporary one.
  ``DATA_DIR`` (a directory of Parquet files: columns ``id`` int64 unique 0..N-1,
  ``label`` int32, ``x`` float64, ``vec`` 3 x float32, ``text`` string) and
  ``ORC_DIR`` (the same rows as ORC) are already defined, and ``DATA_ROWS`` is N.
- Setup the reader does not need to see goes in an HTML comment right before the
  block that needs it; it runs in the same interpreter and is not rendered:
  ``<!-- test-setup`` newline, python code, newline ``-->``.
- The environment has ``RANK=0 WORLD_SIZE=1 MASTER_ADDR MASTER_PORT`` set, so
  ``torch.distributed.init_process_group("gloo")`` works as a one-rank job.
- In ```bash / ```console blocks, every line that starts with ``tdu `` or
  ``python -m torch_dataloader_utils`` (after an optional ``$ ``) runs, in page
  order with the python blocks, through ``torch_dataloader_utils.cli.main``
  (``$DATA_DIR`` expanded, ``> file`` honoured); it must exit 0. The demo is
  left to tests/test_demo.py, which runs it and checks its output.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from datagen import write_dataset

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
LAYOUT = [[300, 200], [500], [250, 250, 100], [400]]

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$", re.M | re.S)
SETUP = re.compile(r"<!--\s*test-setup[ \t]*\n(?P<body>.*?)-->", re.S)
CLI_LINE = re.compile(r"^\s*(?:\$\s+)?((?:tdu|python -m torch_dataloader_utils)\b.*)$")


def code_blocks(text: str) -> list[tuple[str, int, str]]:
    """(language, first line number, code) of every fenced block and test-setup comment, in page order."""
    found = []
    for match in FENCE.finditer(text):
        info = match.group("info").strip()
        language = info.split()[0].lstrip(".{").rstrip("}").lower() if info else ""
        body = textwrap.dedent(match.group("body"))
        found.append((match.start(), language, body))
    for match in SETUP.finditer(text):
        found.append((match.start(), "setup", textwrap.dedent(match.group("body"))))
    found.sort()
    return [(language, text.count("\n", 0, start) + 2, body) for start, language, body in found]


def python_blocks(page: Path) -> list[tuple[int, str]]:
    return [(line, code) for language, line, code in code_blocks(page.read_text()) if language in ("python", "py", "setup")]


SHELL = ("bash", "console", "shell", "sh")


def _commands(code: str) -> list[str]:
    """tdu command lines of a shell block (the demo is left to tests/test_demo.py)."""
    commands = [m.group(1) for m in map(CLI_LINE.match, code.splitlines()) if m]
    return [c for c in commands if "demo" not in c.split("#")[0].split()]


def cli_lines(page: Path) -> list[str]:
    return [c for language, _, code in code_blocks(page.read_text()) if language in SHELL for c in _commands(code)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    data = tmp_path_factory.mktemp("docs_data")
    rows = write_dataset(data / "parquet", LAYOUT, "parquet")
    write_dataset(data / "orc", LAYOUT, "orc")
    return {
        **os.environ,
        "DATA_DIR": str(data / "parquet"),
        "ORC_DIR": str(data / "orc"),
        "DATA_ROWS": str(rows),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "TDU_PROGRESS": "0",
    }


_PRELUDE = """
import contextlib, os, shlex, sys
DATA_DIR, ORC_DIR, DATA_ROWS = os.environ["DATA_DIR"], os.environ["ORC_DIR"], int(os.environ["DATA_ROWS"])

def __run_cli(line):
    from torch_dataloader_utils.cli import main
    words = shlex.split(os.path.expandvars(line), comments=True)
    target = None
    if ">" in words:
        target, words = words[words.index(">") + 1], words[:words.index(">")]
    argv = words[1:] if words[0] == "tdu" else words[3:]
    with (open(target, "w") if target else contextlib.nullcontext(sys.stdout)) as out, contextlib.redirect_stdout(out):
        code = main(argv)
    assert code == 0, f"`{line}` exited with {code}"

__ns = dict(globals())
"""


def page_script(page: Path) -> str:
    """One script running the page's examples in page order: python blocks, setup comments, tdu lines."""
    parts = [_PRELUDE]
    for language, line, code in code_blocks(page.read_text()):
        if language in ("python", "py", "setup"):
            parts.append(f"exec(compile({code!r}, {f'{page.name}:{line}'!r}, 'exec'), __ns)")
        elif language in SHELL:
            parts += [f"__run_cli({command!r})" for command in _commands(code)]
    return "\n".join(parts) + "\n"


RUNNABLE = [p for p in PAGES if python_blocks(p) or cli_lines(p)]


def _run_page(page: Path, env: dict, workdir: Path) -> subprocess.CompletedProcess:
    workdir.mkdir()
    script = workdir / "page_examples.py"
    script.write_text(page_script(page))
    env = {**env, "MASTER_PORT": str(_free_port())}
    return subprocess.run([sys.executable, str(script)], cwd=workdir, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def page_results(env, tmp_path_factory):
    """Every page's examples, two pages at a time (each page in its own interpreter and directory)."""
    root = tmp_path_factory.mktemp("docs_pages")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {page: pool.submit(_run_page, page, env, root / page.stem) for page in RUNNABLE}
        return {page: future.result() for page, future in futures.items()}


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: p.name)
def test_page_examples_run(page, page_results):
    result = page_results[page]
    assert result.returncode == 0, f"examples of docs/{page.name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"


def test_extractor_finds_indented_blocks_and_setup_comments():
    text = "intro\n<!-- test-setup\nx = 1\n-->\n```python\ny = x + 1\n```\n!!! note\n    ```python\n    z = y\n    ```\n```bash\n$ tdu plan $DATA_DIR\nls\n```\n"
    blocks = code_blocks(text)
    assert [(language, code) for language, _, code in blocks] == [
        ("setup", "x = 1\n"), ("python", "y = x + 1\n"), ("python", "z = y\n"), ("bash", "$ tdu plan $DATA_DIR\nls\n")
    ]
    assert blocks[1][1] == 6  # line of the first code line


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    config = (ROOT / "mkdocs.yml").read_text()
    in_nav = set(re.findall(r":\s*([\w./-]+\.md)\s*$", config, re.M))
    assert in_nav == {p.name for p in PAGES}


def test_mkdocs_build_strict(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "create_dataloader" in api and "load_state_dict" in api  # the reference is generated from docstrings


def test_api_arguments_table_matches_the_signatures():
    import inspect

    from torch_dataloader_utils import StructuredDataLoader, StructuredDataset

    table = re.findall(r"^\| `(\w+)` \| (.+?) \|", (DOCS / "api.md").read_text(), re.M)
    documented = dict(table)
    parameters = {**inspect.signature(StructuredDataset.__init__).parameters, **inspect.signature(StructuredDataLoader.__init__).parameters}
    parameters = {name: p for name, p in parameters.items() if name not in ("self", "dataset")}
    assert set(documented) == set(parameters)
    for name, parameter in parameters.items():
        expected = "(required)" if parameter.default is inspect.Parameter.empty else f"`{parameter.default!r}`"
        assert documented[name] == expected, name
