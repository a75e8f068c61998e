"""Optional dependencies: torchdata and the cloud clients are imported only when used, and the
package resumes exactly in a process where torchdata cannot be imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from datagen import write_dataset

LAYOUT = [[23, 31, 17], [40, 9], [11, 29, 33, 14]]
ROWS = sum(map(sum, LAYOUT))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("optional")
    write_dataset(root, LAYOUT)
    return str(root)


def test_optional_dependencies_are_not_imported_by_local_use(data):
    """torchdata and the cloud clients load only when used: importing the package, building a
    dataset on local files and reading an epoch with workers, then a state, import none of them."""
    script = textwrap.dedent(
        f"""
        import sys
        import torch_dataloader_utils
        loader, dataset = torch_dataloader_utils.StructuredDataset.create_dataloader({data!r}, num_workers=2)
        sum(1 for _ in loader)
        dataset.state_dict()
        print(sorted(m for m in ("torchdata", "s3fs", "gcsfs", "adlfs") if m in sys.modules))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_package_works_without_torchdata(data):
    """A real resume in a process where torchdata cannot be imported."""
    script = textwrap.dedent(
        f"""
        import sys

        class NoTorchdata:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "torchdata":
                    raise ModuleNotFoundError(f"No module named {{name!r}}")

        sys.meta_path.insert(0, NoTorchdata())
        from torch_dataloader_utils import StructuredDataset
        whole = [b["id"].tolist() for b in StructuredDataset.create_dataloader({data!r}, batch_size=13, num_workers=1)[0]]
        loader, dataset = StructuredDataset.create_dataloader({data!r}, batch_size=13, num_workers=1)
        first = [b["id"].tolist() for _, b in zip(range(3), loader)]
        state = dataset.state_dict()
        loader, dataset = StructuredDataset.create_dataloader({data!r}, batch_size=13, num_workers=1)
        dataset.load_state_dict(state)
        rest = [b["id"].tolist() for b in loader]
        assert first + rest == whole and sorted(i for b in whole for i in b) == list(range({ROWS}))
        assert not any(name.split(".")[0] == "torchdata" for name in sys.modules)
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"
