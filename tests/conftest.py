import os
import sys

import pytest
from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))

# The same examples on every run and no deadline: a CI run must not pass or fail by chance (a shared
# machine's pause of 200 ms failed a property test's default deadline). HYPOTHESIS_PROFILE=explore
# draws new examples each run, for hunting locally.
settings.register_profile("repeatable", deadline=None, derandomize=True, database=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture
def seek_tiny_files(monkeypatch):
    """parquet_seek seeks in the tests' tiny files too: its cost thresholds (the footer, page
    index and page headers it decodes in Python against the bytes saved) set to nothing. Forked
    DataLoader workers inherit the setting."""
    from torch_dataloader_utils.formats import _parquet_seek as parquet_seek

    monkeypatch.setattr(parquet_seek, "THRIFT_BYTE_COST", 0)
    monkeypatch.setattr(parquet_seek, "THRIFT_SKIP_BYTE_COST", 0)
    monkeypatch.setattr(parquet_seek, "HEADER_COST", 0)
