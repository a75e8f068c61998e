"""host_feed.py: chunks taken in and cut into batches in a thread of the loop's process (the
default with workers), with the same batches, counts and resumes as when the loop's thread does it."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest
import torch
from datagen import write_dataset

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.read.chunks import Chunk
from torch_dataloader_utils.read.convert import table_to_columns
from torch_dataloader_utils.runtime.host_feed import HostFeed, prepare
from torch_dataloader_utils.testing import assert_resumes_exactly


def rows(batch) -> tuple:
    return (tuple(batch["id"].tolist()), tuple(map(tuple, batch["vec"].tolist())), tuple(batch["text"]))


def feed_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tdu-host-feed"]


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_batches_through_the_feed_equal_those_cut_by_the_loop(tmp_path, mode):
    write_dataset(tmp_path, [[30, 25], [40], [9]])
    config = dict(batch_size=7, num_workers=2, chunk_rows=14, shuffle=True, shuffle_seed=2, worker_mode=mode)
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), **config)
    assert isinstance(loader._ahead, HostFeed)
    fed = [rows(b) for b in loader]
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), **config)
    loader._ahead = None
    assert fed == [rows(b) for b in loader]


def test_no_feed_without_workers(tmp_path):
    write_dataset(tmp_path, [[10]])
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), batch_size=5, num_workers=0)
    assert loader._ahead is None


@pytest.mark.parametrize("persistent", [False, True])
def test_resume_equivalence_through_the_feed(tmp_path, persistent):
    write_dataset(tmp_path, [[20, 13], [17]])
    assert_resumes_exactly(
        lambda: StructuredDataset.create_dataloader(
            str(tmp_path), batch_size=6, num_workers=2, chunk_rows=12, shuffle=True, shuffle_seed=1, persistent_workers=persistent
        ),
        epochs=2,
        stride=3,
    )


def test_an_abandoned_pass_stops_its_thread_and_counts_only_what_the_loop_got(tmp_path):
    write_dataset(tmp_path, [[40], [40]])
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), batch_size=5, num_workers=2, chunk_rows=10)
    seen = []
    for i, batch in enumerate(loader):
        seen += batch["id"].tolist()
        if i == 5:
            break
    assert dataset.state_dict()["batches_delivered"] == 6  # chunks cut ahead are not counted
    seen += [i for batch in loader for i in batch["id"].tolist()]
    assert sorted(seen) == list(range(80))
    loader._ahead.close()
    assert loader._ahead._thread is None and not feed_threads()


def test_an_error_in_a_worker_reaches_the_loop(tmp_path):
    write_dataset(tmp_path, [[20], [20], [20]])
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), batch_size=5, num_workers=2, chunk_rows=10)
    (tmp_path / "part-00002.parquet").write_bytes(b"PAR1" + b"\0" * 100 + b"PAR1")
    with pytest.raises(Exception, match="part-00002"):
        list(loader)


def test_prepare_cuts_batches_and_leaves_chunks_it_cannot_cut_ahead():
    chunk = Chunk(0, 0, 10, {"x": torch.arange(10)})
    prepared = prepare(chunk, 4)
    assert [b["x"].tolist() for b in prepared.prepared] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [end for _, end in prepared.batches(4)] == [4, 8, 10]
    skipped = Chunk(0, 0, 10, {"x": torch.arange(8)}, present=np.arange(8))
    assert prepare(skipped, 4) is skipped  # a batch's end depends on the rows skipped
    assert prepare(prepared, 4) is prepared


def test_a_chunk_with_strings_is_left_for_the_loop_to_cut(tmp_path):
    """The loop's thread builds each batch's strings right before it reads them."""
    text = pa.array([f"row {i}" for i in range(10)])
    columns = table_to_columns(pa.table({"x": pa.array(range(10)), "text": text}), lambda: "test")
    chunk = Chunk(0, 0, 10, columns)
    assert prepare(chunk, 4) is chunk
    assert [batch["text"] for batch, _ in chunk.batches(4)] == [[f"row {i}" for i in range(s, min(s + 4, 10))] for s in (0, 4, 8)]
    write_dataset(tmp_path, [[30]])
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), batch_size=7, num_workers=2, chunk_rows=14)
    taken = []
    original = loader._ahead.chunks

    def noting(*args, **kwargs):
        for fed in original(*args, **kwargs):
            taken.append(fed)
            yield fed

    loader._ahead.chunks = noting
    assert sum(len(batch["text"]) for batch in loader) == 30
    assert taken and all(fed.prepared is None for fed in taken if fed.num_read)


def test_a_string_that_is_not_utf8_fails_at_its_batch_not_ahead(tmp_path):
    """The chunk that holds it goes to the loop uncut: the batches before it are delivered."""
    import pyarrow.parquet as pq

    strings = pa.Array.from_buffers(pa.string(), 4, [None, pa.py_buffer(np.array([0, 1, 2, 3, 6], np.int32)), pa.py_buffer(b"abc\xff\xfeA")])
    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"s": strings, "id": np.arange(4)}), tmp_path / "d" / "a.parquet")
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path / "d"), batch_size=1, num_workers=2, chunk_rows=4)
    received = []
    with pytest.raises(ValueError, match="not valid UTF-8"):
        for batch in loader:
            received.append(batch["s"])
    assert received == [["a"], ["b"], ["c"]]
    assert dataset.state_dict()["batches_delivered"] == 3


@pytest.mark.parametrize("persistent", [False, True])
def test_a_finished_pass_unmaps_its_workers_buffers_in_the_feeds_thread(tmp_path, persistent):
    """Not at the next iter(), in the loop's thread; persistent workers keep theirs."""
    write_dataset(tmp_path, [[40], [40]])
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), batch_size=5, num_workers=2, chunk_rows=10, persistent_workers=persistent)
    if loader._board is None:
        pytest.skip("no shared buffers on this platform")
    batches = list(loader)
    loader._ahead.close()
    assert bool(loader._board._mappings) == persistent
    assert sorted(i for b in batches for i in b["id"].tolist()) == list(range(80))  # the batches keep their memory


class PacedSource:
    """Chunks that come when the test lets them (``allow``), noting how many were made."""

    def __init__(self, count: int):
        self.count = count
        self.made = 0
        self._allowed = threading.Semaphore(0)

    def allow(self, n: int = 1) -> None:
        for _ in range(n):
            self._allowed.release()

    def __iter__(self):
        for i in range(self.count):
            assert self._allowed.acquire(timeout=10), "the test never allowed the chunk"
            self.made += 1
            yield Chunk(0, i, i + 1, {"x": torch.tensor([i])})


def wait_until(condition, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.002)
    return True


def test_a_slow_loop_has_depth_finished_chunks_ahead_and_no_more():
    source = PacedSource(10)
    source.allow(10)
    it = HostFeed(depth=1).chunks(source, 10, 1)
    for expected in range(10):
        assert next(it).start == expected
        ahead = min(10, expected + 2)  # the chunk the loop is on, and one finished ahead
        assert wait_until(lambda: source.made == ahead)  # noqa: B023 - called before the loop moves on
        time.sleep(0.01)
        assert source.made == ahead  # and no more
    assert list(it) == []


def test_an_error_in_the_feeds_thread_reaches_the_loop_after_the_chunks_before_it():
    def failing():
        yield Chunk(0, 0, 1, {"x": torch.tensor([0])})
        yield Chunk(0, 1, 2, {"x": torch.tensor([1])})
        raise OSError("disk gone")

    it = HostFeed().chunks(failing(), 5, 1)
    assert [next(it).start, next(it).start] == [0, 1]
    with pytest.raises(OSError, match="disk gone"):
        next(it)


class Freed:
    """Notes the thread that frees it."""

    def __init__(self, log: list):
        self.log = log

    def __del__(self):
        self.log.append(threading.current_thread().name)


def test_chunks_the_loop_is_done_with_are_freed_in_the_feeds_thread():
    """Also when the loop waits for every chunk: a reference left in the loop's thread would free a
    chunk's batches (a text chunk's 32,768 strings: about 1 ms) there."""
    freed: list[str] = []

    def slow():
        for i in range(8):
            time.sleep(0.01)  # the loop waits for every chunk
            yield Chunk(0, i, i + 1, {}, prepared=[{"x": Freed(freed)}])

    it = HostFeed().chunks(slow(), 8, 1)
    for expected in range(8):
        chunk = next(it)
        assert chunk.start == expected
        del chunk
    # chunk i goes back when the loop takes chunk i + 2, and is freed when the feed's thread takes
    # in its next chunk: chunks 0 to 4 before the last pull; the rest go with the pass
    assert wait_until(lambda: len(freed) >= 5)
    assert freed[:5] == ["tdu-host-feed"] * 5
    assert list(it) == []


def test_the_pass_ends_for_the_loop_before_at_end_runs_and_the_next_pass_waits_for_it():
    """``at_end`` (freeing the finished workers' buffers) runs after the loop has the pass's end;
    the feed's next pass starts only once it has finished."""
    release, done = threading.Event(), threading.Event()

    def at_end():
        release.wait(10)
        done.set()

    feed = HostFeed()
    chunks = (Chunk(0, i, i + 1, {"x": torch.tensor([i])}) for i in range(3))
    assert [chunk.start for chunk in feed.chunks(chunks, 3, 1, at_end=at_end)] == [0, 1, 2]
    assert not done.is_set()  # the loop's pass ended while at_end still runs
    following = feed.chunks(iter([Chunk(0, 0, 1, {"x": torch.tensor([0])})]), 1, 1)
    threading.Timer(0.05, release.set).start()
    assert next(following).start == 0
    assert done.is_set()  # the next pass waited for it
