"""What planning leaves in the main process: imports it does not need, freed memory handed back."""

from __future__ import annotations

import subprocess
import sys

from torch_dataloader_utils.catalog import memory
from torch_dataloader_utils.formats._lazy import LazyModule


def test_the_dataset_imports_neither_pyarrow_compute_nor_pyarrow_dataset_nor_pandas(tmp_path):
    """They cost a planning-only main process 50 MB; filters=, nulls and conversions import them when used."""
    from datagen import write_dataset

    write_dataset(tmp_path, [[30, 25], [40]])
    script = (
        "import sys\nfrom torch_dataloader_utils import StructuredDataset\n"
        f"dataset = StructuredDataset({str(tmp_path)!r}, num_workers=2, batch_size=8)\n"
        "print(sorted(m for m in ('pyarrow.compute', 'pyarrow.dataset', 'pandas') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_lazy_module_is_imported_when_a_name_is_first_used():
    lazy = LazyModule("json")
    assert lazy.dumps([1]) == "[1]"
    assert lazy.JSONDecodeError is __import__("json").JSONDecodeError


def test_freed_memory_is_handed_back_only_after_many_files(monkeypatch):
    calls = []

    class Libc:
        def malloc_trim(self, pad):
            calls.append(pad)

    monkeypatch.setattr(memory.ctypes, "CDLL", lambda name: Libc())
    memory.return_freed_memory(memory.TRIM_AFTER_FILES - 1)
    assert calls == []
    memory.return_freed_memory(memory.TRIM_AFTER_FILES)
    assert calls == [0]


def test_no_malloc_trim_is_no_error(monkeypatch):
    class Libc:
        pass

    monkeypatch.setattr(memory.ctypes, "CDLL", lambda name: Libc())
    memory.return_freed_memory(memory.TRIM_AFTER_FILES)
