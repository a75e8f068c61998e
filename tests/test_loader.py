"""StructuredDataLoader's worker set-up and error paths."""

from __future__ import annotations

import collections
import itertools
import os
import random
import subprocess
import sys
import time
import traceback

import pytest
from datagen import write_dataset
from interrupts import interrupted_at
from resume_helpers import batch_key
from torch.utils.data import get_worker_info

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.read.chunks import ChunkReader


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_start_without_transparent_huge_pages(tmp_path, context):
    """Read from the loader's real worker processes while they are alive."""
    import psutil

    if "THP_enabled:" not in open("/proc/self/status").read():
        pytest.skip("this kernel does not report THP_enabled")
    write_dataset(tmp_path, [[10], [10]])
    loader, _ = StructuredDataset.create_dataloader(
        str(tmp_path), batch_size=5, chunk_rows=5, num_workers=2, multiprocessing_context=context, persistent_workers=True
    )
    before = {child.pid for child in psutil.Process().children()}
    assert len(list(loader)) == 4  # each worker read chunks, so each ran its init function; they stay alive
    new = [child for child in psutil.Process().children() if child.pid not in before]
    workers = [child for child in new if "resource_tracker" not in " ".join(child.cmdline())]  # spawn starts one
    statuses = [open(f"/proc/{worker.pid}/status").read() for worker in workers]
    assert len(statuses) == 2
    assert all("THP_enabled:\t0" in status for status in statuses), [s for s in statuses if "THP_enabled" in s]
    assert "THP_enabled:\t1" in open("/proc/self/status").read()  # the main process keeps the kernel's default


def test_worker_start_shortens_the_gil_switch_interval():
    """So that torch's queue feeder thread hands a finished chunk over without waiting 5 ms for
    the GIL (run in a new interpreter: the setting is process-wide)."""
    script = (
        "import sys; from torch_dataloader_utils.runtime.loader import _WorkerStart, WORKER_SWITCH_INTERVAL_S as want; "
        "before = sys.getswitchinterval(); _WorkerStart(None)(0); print(before, sys.getswitchinterval(), want)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    before, after, want = map(float, out.stdout.split())
    assert after == pytest.approx(want) and want < before


def test_an_error_kept_by_the_caller_does_not_keep_torchs_iterator():
    """torch chains the errors raised inside its iterator; their frames would keep it (and its
    workers) alive as long as the caller keeps the loader's error."""
    from torch_dataloader_utils.runtime.loader import _drop_tracebacks

    def inner():
        raise ConnectionResetError("worker gone")

    try:
        try:
            inner()
        except ConnectionResetError as error:
            raise RuntimeError("DataLoader worker exited unexpectedly") from error
    except RuntimeError as caught:
        kept = caught
    assert kept.__traceback__ is not None and kept.__cause__.__traceback__ is not None
    _drop_tracebacks(kept)
    assert kept.__traceback__ is None and kept.__cause__.__traceback__ is None


def test_a_forked_worker_whose_process_is_gone_exits_at_once(tmp_path):
    """torch's worker would wait forever for a parent that died before it read its pid."""
    write_dataset(tmp_path, [[10]])
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), batch_size=5, num_workers=1, multiprocessing_context="fork")
    assert loader._loader.worker_init_fn.parent == os.getpid()
    gone = subprocess.run(  # a process whose parent is not the one recorded, as after that parent died
        [sys.executable, "-c", "from torch_dataloader_utils.runtime.loader import _WorkerStart; _WorkerStart(1)(0); print('still running')"],
        capture_output=True, text=True, timeout=60,
    )
    assert gone.returncode == 0 and "still running" not in gone.stdout
    spawned, _ = StructuredDataset.create_dataloader(str(tmp_path), batch_size=5, num_workers=1, multiprocessing_context="spawn")
    assert spawned._loader.worker_init_fn.parent is None  # a spawned worker is checked by torch alone
    assert [len(batch["id"]) for batch in spawned] == [5, 5]


def test_an_error_read_in_the_main_process_keeps_its_traceback(tmp_path):
    """With num_workers=0 nothing needs shutting down, so the user sees where the error arose."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, None, 3]}), tmp_path / "a.parquet", write_statistics=False)  # no null counts: found as rows are read
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), num_workers=0)
    with pytest.raises(ValueError, match="null value") as error:
        list(loader)
    files = [frame.filename for frame in traceback.extract_tb(error.value.__traceback__)]
    assert any(name.endswith("convert.py") for name in files), files


@pytest.mark.parametrize("persistent", [False, True])
def test_after_a_timeout_the_next_pass_continues_exactly(tmp_path, monkeypatch, persistent):
    """A worker stuck past `timeout` fails the pass; iterating again continues where the loop stopped."""
    write_dataset(tmp_path / "data", [[300], [300]])
    config = dict(batch_size=50, chunk_rows=100, num_workers=2, timeout=3, persistent_workers=persistent)
    full = [batch_key(batch) for batch in StructuredDataset.create_dataloader(str(tmp_path / "data"), **{**config, "timeout": 0})[0]]
    stuck = tmp_path / "stuck"
    read_chunk = ChunkReader.read

    def slow_in_worker_1(self, task, joined=False):  # the real read, after a stall while `stuck` exists
        info = get_worker_info()
        waited = 0
        while info is not None and info.id == 1 and stuck.exists() and waited < 1200:  # (a minute at most)
            time.sleep(0.05)
            waited += 1
        return read_chunk(self, task, joined)

    monkeypatch.setattr(ChunkReader, "read", slow_in_worker_1)
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path / "data"), **config)
    assert (loader.num_workers, loader.batch_size) == (2, 50)
    stuck.touch()
    received = []
    with pytest.raises(RuntimeError, match="timed out"):
        for batch in loader:
            received.append(batch_key(batch))
    stuck.unlink()
    received += [batch_key(batch) for batch in loader]
    assert received == full


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # interrupts swallowed in finalizers
@pytest.mark.parametrize("batch_size", [1, 7])
def test_interrupts_anywhere_lose_no_batch_and_the_epoch_goes_on(tmp_path, batch_size):
    """A KeyboardInterrupt may strike wherever CPython handles signals in the loop's next(): it must
    never fall between a batch counted and a batch received, and the next pass must go on exactly
    (an interrupted stream in the main process failed every later read of its piece). Read in the
    main process, where all of the loader's code runs in the loop's thread."""
    write_dataset(tmp_path / "d", [[700, 300], [500], [500]])
    config = dict(batch_size=batch_size, chunk_rows=50, num_workers=0)
    full = [batch["id"].tolist() for batch in StructuredDataset.create_dataloader(str(tmp_path / "d"), **config)[0]]
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path / "d"), **config)
    rng = random.Random(3)
    received: collections.deque = collections.deque()  # filled in C: nothing runs between next() and the append
    interrupts = passes = 0
    while len(received) < len(full) and passes < 2000:
        passes += 1
        # At most 40 batches a pass: an interrupt that strikes in a finalizer is swallowed (by CPython,
        # as a real one would be) and must not let one pass read the rest of the epoch.
        interrupts += interrupted_at(lambda: received.extend(itertools.islice(loader, 40)), rng.randint(1, 1500))
        rows = sum(len(batch["id"]) for batch in received)
        assert sum(dataset.state_dict()["rows_delivered"]) == rows, f"after {interrupts} interrupts"
    assert interrupts >= 20, f"only {interrupts} interrupts: the test did not exercise them"
    assert [batch["id"].tolist() for batch in received] == full



def test_persistent_workers_interrupted_while_a_pass_starts_serve_the_next_pass(tmp_path):
    """torch's persistent iterator, interrupted while it resets for a new pass, is left half-reset
    and failed the next pass (KeyError: _ResumeIteration); the loader starts new workers instead.
    In a process of its own: the interrupts also strike in torch's worker bookkeeping."""
    write_dataset(tmp_path / "d", [[700, 300], [500], [500]])
    job = os.path.join(os.path.dirname(__file__), "interrupt_job.py")
    run = subprocess.run([sys.executable, job, str(tmp_path / "d")], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert int(run.stdout) >= 10, f"only {run.stdout.strip()} interrupts: the job did not exercise them"
