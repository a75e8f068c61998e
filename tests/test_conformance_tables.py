"""Black-box conformance of the table datasets with the promises StructuredDataset makes for
``filters=``: the DNF list form is taken, and a resume with other row filters is refused."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pytest
from table_helpers import iceberg_config, iceberg_table, rows

from torch_dataloader_utils import CheckpointMismatchError

pytestmark = pytest.mark.timeout(120)


def _ids(loader) -> list[int]:
    return sorted(i for batch in loader for i in batch["id"].tolist())


@pytest.fixture
def delta_path(tmp_path):
    deltalake = pytest.importorskip("deltalake")
    path = str(tmp_path / "delta")
    deltalake.write_deltalake(path, rows(0, 600))
    return path


def test_delta_filters_take_the_dnf_list_form(delta_path):
    from torch_dataloader_utils import DeltaDataset

    loader, dataset = DeltaDataset.create_dataloader(delta_path, batch_size=64, num_workers=0, filters=[("id", "<", 100)])
    expression_loader, _ = DeltaDataset.create_dataloader(delta_path, batch_size=64, num_workers=0, filters=pc.field("id") < 100)
    assert len(dataset) == 100 and _ids(loader) == _ids(expression_loader) == list(range(100))


def test_iceberg_filters_take_the_dnf_list_form(tmp_path):
    pytest.importorskip("pyiceberg")
    from torch_dataloader_utils import IcebergDataset

    config = iceberg_config(str(tmp_path))
    iceberg_table(config).append(rows(0, 500))
    loader, dataset = IcebergDataset.create_dataloader("db.t", config, batch_size=64, num_workers=0, filters=[[("id", "<", 10)], [("x", ">=", 245.0)]])
    assert len(dataset) == 20 and _ids(loader) == list(range(10)) + list(range(490, 500))


@pytest.mark.parametrize("other", [[("id", ">=", 500)], None], ids=["another filter", "no filter"])
def test_a_table_state_resumed_with_other_filters_is_refused(delta_path, other):
    from torch_dataloader_utils import DeltaDataset

    loader, dataset = DeltaDataset.create_dataloader(delta_path, batch_size=64, num_workers=0, filters=[("id", "<", 300)])
    iterator = iter(loader)
    next(iterator)
    state = json.loads(json.dumps(dataset.state_dict()))
    _, resumed = DeltaDataset.create_dataloader(delta_path, batch_size=64, num_workers=0, filters=other)
    with pytest.raises(CheckpointMismatchError, match="filters changed"):
        resumed.load_state_dict(state)
    _, same = DeltaDataset.create_dataloader(delta_path, batch_size=64, num_workers=0, filters=pc.field("id") < 300)
    same.load_state_dict(state)  # the list form and its expression are one filter
