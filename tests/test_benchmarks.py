"""The benchmark scripts start and parse their documented options; generate.py writes exactly the files asked for;
run.py's targets report and resume-ratio interval, on fixed figures; the consumer behind every throughput figure
reads every byte (a poisoned column makes it fail), in run.py's loop and in the ceiling's processes.

(The measurements themselves run by hand: docs/performance.md, docs/object-stores.md, docs/shuffling.md.)
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from servers import s3, store_registry  # noqa: F401 - fixtures

BENCHMARKS = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")
SCRIPTS = ["run.py", "generate.py", "native_profile.py", "object_stores.py", "shuffle_quality.py", "stateful_overhead.py", "read_cost.py", "output_formats.py", "filter_counts.py", "random_access.py", "text_formats.py", "mixing.py", "many_files.py", "gpu_feed.py", "main_capacity.py"]


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


def test_run_takes_contenders_by_letter_and_refuses_unknown_ones():
    run = _import_run()
    assert run.contender_names("a,d_this_library,e") == ["a_ceiling", "d_this_library", "e_reader_threads"]
    with pytest.raises(Exception, match="unknown contender 'z'"):
        run.contender_names("a,z")


def test_run_reports_each_target_and_where_a_peer_won():
    run = _import_run()
    timed = _resume(0.07, vs_fresh=1.3, vs_fresh_interval=[1.1, 1.45], first_batch_samples=[0.07] * 5)
    ours = _contender(850_000, 0.05, 450, {"0.1": _resume(0.05), "0.5": _resume(0.06, lost=3), "0.9": timed})
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


def _import(name: str):
    sys.path.insert(0, BENCHMARKS)
    try:
        return __import__(name)
    finally:
        sys.path.remove(BENCHMARKS)


class Poisoned(torch.Tensor):
    """A tensor whose every torch operation raises: a consumer that reads it must fail."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.__repr__, torch.Tensor.__format__):
            return "Poisoned"
        raise RuntimeError(f"poisoned column read ({getattr(func, '__name__', func)})")


class PoisonedStr(str):
    def __len__(self):
        raise RuntimeError("poisoned string read")


def _batch(rows: int = 8) -> dict:
    """One column of each form a loader hands over."""
    from torch_dataloader_utils import Ragged

    return {
        "id": torch.arange(rows),
        "label": torch.ones(rows, dtype=torch.int32),
        "feat": torch.randn(rows, 4),
        "tokens": Ragged(torch.arange(3 * rows, dtype=torch.float32), torch.arange(0, 3 * rows + 1, 3)),
        "text": [f"row {i}" for i in range(rows)],
        "struct": {"x": np.arange(rows, dtype=np.float32)},
    }


def test_the_consumer_reads_every_byte_of_every_column_form():
    consume = _import("consume")
    batch = _batch()
    assert consume.read_batch(batch) == pytest.approx(sum(consume.read_column(v) for v in batch.values()))
    for name in ("id", "label", "feat"):
        with pytest.raises(RuntimeError, match="poisoned"):
            consume.read_batch({**batch, name: batch[name].as_subclass(Poisoned)})
    ragged = batch["tokens"]
    for poisoned in (ragged._replace(values=ragged.values.as_subclass(Poisoned)), ragged._replace(offsets=ragged.offsets.as_subclass(Poisoned))):
        with pytest.raises(RuntimeError, match="poisoned"):
            consume.read_batch({**batch, "tokens": poisoned})
    with pytest.raises(RuntimeError, match="poisoned"):  # the last string too, after a None (a null)
        consume.read_batch({**batch, "text": batch["text"][:-2] + [None, PoisonedStr("last")]})
    # every element: a NaN anywhere in a (non-contiguous) float column reaches the checksum
    feat = torch.randn(6, 5)
    for index in range(feat.numel()):
        poisoned = feat.clone()
        poisoned.view(-1)[index] = float("nan")
        assert np.isnan(consume.read_batch({"feat": poisoned.t()}))
    # an integer column: the last element changes the checksum
    ids = torch.arange(100)
    assert consume.read_batch({"id": ids}) != consume.read_batch({"id": torch.cat([ids[:-1], torch.tensor([7])])})
    for unknown in (object(), 3, [object()]):
        with pytest.raises(TypeError):
            consume.read_batch({"x": unknown})
    assert [part["id"].tolist() for part in consume.slices({"id": torch.arange(5), "s": list("abcde")}, 5, 2)] == [[0, 1], [2, 3], [4]]


def test_runs_child_reads_every_batch_unless_untouched(monkeypatch):
    """run.py's loop applies the consumer to what a contender yields: a poisoned batch fails the
    touched epoch and not the untouched one."""
    run = _import_run()
    batches = [_batch(4), {**_batch(4), "feat": _batch(4)["feat"].as_subclass(Poisoned)}]
    monkeypatch.setitem(run.CONTENDERS, "z_poisoned", lambda cfg, state: (iter(batches), lambda: None))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # the child's setting, not this process's
    spec = {"contender": "z_poisoned", "config": {"files": [], "columns": []}, "total_rows": 8, "work": "", "collect_ids": False}
    with pytest.raises(RuntimeError, match="poisoned"):
        run.child(spec)
    out = run.child({**spec, "touch": False})
    assert out["rows"] == 8 and out["batches"] == 2 and out["cpu_us_per_batch"] >= 0 and out["faults_per_batch"] >= 0
    monkeypatch.setitem(run.CONTENDERS, "z_poisoned", lambda cfg, state: (iter(batches[:1]), lambda: None))
    assert run.child(spec)["rows"] == 4


def _parquet(tmp_path, rows: int) -> str:
    import pyarrow.parquet as pq

    generate = _import("generate")
    path = str(tmp_path / "part.parquet")
    pq.write_table(generate.make_table(0, rows), path, row_group_size=rows)
    return path


def test_the_ceiling_reads_what_it_decodes_in_its_own_processes(tmp_path, monkeypatch):
    import multiprocessing

    contenders = _import("contenders")
    path = _parquet(tmp_path, 2500)
    reads = multiprocessing.get_context("fork").Queue()
    monkeypatch.setattr(contenders, "read_batch", lambda part: reads.put((len(part["id"]), sorted(part))))
    for touch in (True, False):
        delivered = sum(contenders._from_processes(contenders._decode_files, [([path], ["id", "feat", "text"], touch, 1000)]))
        assert delivered == 2500
        seen = []
        while len(seen) < (3 if touch else 0):
            seen.append(reads.get(timeout=10))
        assert reads.empty()
        assert seen == ([(1000, ["feat", "id", "text"]), (1000, ["feat", "id", "text"]), (500, ["feat", "id", "text"])] if touch else [])


def test_the_ideal_feeder_hands_over_batches_of_its_own_memory(tmp_path):
    contenders = _import("contenders")
    path = _parquet(tmp_path, 2500)
    cfg = contenders.Config([path, path], ["id", "feat", "text"], batch_size=1000)
    batches = contenders.prepare_ideal(cfg)
    assert [len(b["id"]) for b in batches] == [1000, 1000, 500] * 2
    assert all(isinstance(b["text"], list) and b["feat"].shape[1] == 64 and b["feat"].is_contiguous() for b in batches)
    again, _ = contenders.start_ideal(cfg, prepared=batches)
    assert list(again) == batches


def test_this_library_delivers_the_same_batches_with_worker_processes_and_reader_threads(tmp_path):
    contenders = _import("contenders")
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    paths = [_parquet(tmp_path / name, 2500) for name in ("one", "two")]
    cfg = contenders.Config(paths, ["id", "feat", "text"], batch_size=1000)
    delivered = {}
    for name in ("d_this_library", "e_reader_threads"):
        batches, save_state = contenders.CONTENDERS[name](cfg)
        delivered[name] = [(b["id"].tolist(), b["feat"].sum().item(), b["text"]) for b in batches]
        assert sum(save_state()["rows_delivered"]) == 5000
    assert sorted(i for ids, _, _ in delivered["d_this_library"] for i in ids) == sorted(list(range(2500)) * 2)
    assert delivered["e_reader_threads"] == delivered["d_this_library"]


def test_run_reports_the_read_figures_against_their_targets():
    run = _import_run()


    def full(rows_per_s: float, first: float, pss: float) -> dict:  # with every figure the table prints
        out = _contender(rows_per_s, first, pss, {})
        out["epoch"].update(epoch_s=1.0, cpu_s=2.0)
        return out

    ceiling = full(1e6, 0.05, 400)
    ours = full(700_000, 0.05, 450)
    ours["epoch"].update(cpu_us_per_batch=300.0, cpu_us_per_batch_after_first=290.0, faults_per_batch=4.0)
    ours.update(vs_ceiling=0.70, vs_ceiling_range=[0.6, 0.8], vs_ceiling_untouched=0.95, cpu_vs_ideal=2.0)
    ours["untouched"] = {"rows_per_s": 950_000, "cpu_us_per_batch": 90.0}
    ideal = full(2e7, 0.0, 300)
    ideal["epoch"].update(cpu_us_per_batch=150.0, cpu_us_per_batch_after_first=150.0, faults_per_batch=0.5)
    ideal["vs_ceiling"] = 20.0
    text = full(900_000, 0.05, 450)
    text["epoch"].update(cpu_us_per_batch=170.0, cpu_us_per_batch_after_first=160.0, faults_per_batch=1.0)
    text.update(vs_ceiling=0.86, vs_ceiling_untouched=0.89, cpu_vs_ideal=1.13)
    results = {
        "measurements": {
            "numeric": {"a_ceiling": ceiling, "d_this_library": ours, "i_ideal_feeder": ideal},
            "text": {"a_ceiling": ceiling, "d_this_library": text, "i_ideal_feeder": ideal},
        },
        "row_bytes": {"numeric": 268, "text": 472},
    }
    lines = run.target_lines(results)
    assert "MISSED: numeric rows/s >= 0.90x the ceiling's: 0.70x" in lines
    assert "met: numeric untouched rows/s >= 0.90x the untouched ceiling's: 0.95x" in lines
    assert "MISSED: numeric main-thread CPU per batch <= 1.2x the ideal feeder's: 2.00x (300 against 150 µs)" in lines
    assert "met: text rows/s >= 0.85x the ceiling's: 0.86x" in lines
    assert "MISSED: text untouched rows/s >= 0.90x the untouched ceiling's: 0.89x" in lines
    assert "met: text main-thread CPU per batch <= 1.2x the ideal feeder's: 1.13x (170 against 150 µs)" in lines
    for colset in ("numeric", "text"):  # no resumes measured: no resume lines
        assert not [line for line in lines if line.startswith(("met", "MISSED")) and colset in line and "resum" in line]
    table = run.table(results)
    row = next(line for line in table.splitlines() if line.startswith("| (d)") and "| numeric |" in line)
    assert "| 700,000 | 950,000 | 188 | 0.70 (0.60–0.80) | 0.95 | 300 | 4.0 |" in row
    assert "main-thread CPU per batch (read included) / the ideal feeder's = 2.00 (300 against 150 µs" in table
    ideal_row = next(line for line in table.splitlines() if line.startswith("| ideal feeder") and "| numeric |" in line)
    assert "| 20,000,000 | — |" in ideal_row and "| 20.00 | — | 150 | 0.5 |" in ideal_row


def test_gpu_feeds_ceiling_deals_every_row_group_once_and_evenly(tmp_path):
    import pyarrow.parquet as pq

    generate = _import("generate")
    paths = []
    for index, groups in enumerate([3, 1, 4]):
        paths.append(str(tmp_path / f"part-{index}.parquet"))
        pq.write_table(generate.make_table(0, 100 * groups), paths[-1], row_group_size=100)
    shares = _import("gpu_feed").deal_row_groups(paths, 3)
    dealt = [group for share in shares for group in share]
    assert sorted(dealt) == sorted((path, g) for path, count in zip(paths, [3, 1, 4]) for g in range(count))
    assert [len(share) for share in shares] == [3, 3, 2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the rows a machine without CUDA skips")
def test_gpu_feed_without_cuda_reports_every_gpu_row_as_skipped(tmp_path):
    out = tmp_path / "gpu.json"
    args = ["--size-gb", "0.005", "--files", "2", "--workers", "2", "--seconds", "0.2", "--loader-epochs", "1", "--json", str(out)]
    subprocess.run([sys.executable, os.path.join(BENCHMARKS, "gpu_feed.py"), str(tmp_path / "data"), *args], check=True, capture_output=True, timeout=300)
    import json

    rows = json.loads(out.read_text())["rows"]
    gpu = [name for name in rows if not name.startswith("loader only")]
    assert {"gpu only (fixed batch on the GPU)", "ideal feeder (pinned, non_blocking)", "hand-written IterableDataset w=2"} <= set(gpu)
    assert all(rows[name] is None for name in gpu) and len(gpu) == 8  # skipped, not faked
    assert all(isinstance(rows[name], (int, float)) and rows[name] > 0 for name in rows if name.startswith("loader only"))


def test_main_capacitys_cached_decode_delivers_as_many_rows_with_repeated_values(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from torch_dataloader_utils import StructuredDataset
    from torch_dataloader_utils.read import chunks

    generate = _import("generate")
    path = str(tmp_path / "part.parquet")
    pq.write_table(generate.make_table(0, 5000), path, row_group_size=1000)
    real, _ = StructuredDataset.create_dataloader(path, batch_size=100, num_workers=2, columns=["id"], chunk_rows=500)
    expected = [batch["id"] for batch in real]
    monkeypatch.setattr(chunks.ChunkReader, "read", _import("main_capacity").cached_decode(chunks.ChunkReader.read))
    loader, _ = StructuredDataset.create_dataloader(path, batch_size=100, num_workers=2, columns=["id"], chunk_rows=500)
    batches = [batch["id"] for batch in loader]
    assert [len(b) for b in batches] == [len(b) for b in expected] and sum(map(len, batches)) == 5000
    assert torch.equal(batches[0], expected[0])  # each chunk size's first chunk is decoded
    assert not all(torch.equal(a, b) for a, b in zip(batches, expected))  # the values repeat: decoding was cached


def test_object_store_measurements_run_on_the_s3_server(s3, tmp_path):
    """benchmarks/object_stores.py's read paths of one row group and its many-small-files step (planning,
    then an epoch decoded ahead and one file at a time), on a few files."""
    from servers import BUCKET

    sys.path.insert(0, BENCHMARKS)
    try:
        import generate
        import object_stores
    finally:
        sys.path.remove(BENCHMARKS)
    generate.ensure_dataset(str(tmp_path), 2, 3000, 1000)
    s3.fs.rm(f"{BUCKET}/{object_stores.PREFIX}", recursive=True) if s3.fs.exists(f"{BUCKET}/{object_stores.PREFIX}") else None
    s3.upload(str(tmp_path), object_stores.PREFIX)
    paths = object_stores._read_paths(s3, repeats=1)
    assert {key.split("/")[1] for key in paths} == set(object_stores.READ_PATHS) and all(row["median_ms"] > 0 for row in paths.values())
    many = object_stores._planning(s3, 12, latency=0.0)
    assert many["files"] == 12 and set(many["epoch_s"]) == {"decoded ahead", "one file at a time"}
