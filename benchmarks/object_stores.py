"""Object stores next to local disk, from one run: throughput, bytes fetched vs needed, read paths.

    python benchmarks/object_stores.py [--size-gb 0.1] [--files 8] [--stores s3,gcs,azure] [--name objstores]

Starts the test servers (moto S3, gcp-storage-emulator, Azurite; see tests/servers.py),
uploads the same files to each and measures:

1. one epoch (num_workers=2, shuffle) per location: planning seconds, epoch seconds,
   rows/s, and the ratio to local disk (best of ``--rounds`` epochs, locations interleaved,
   after one warm-up round);
2. bytes fetched / bytes needed for an epoch reading all columns and a projection
   (needed = the projected column chunks of every row group + every footer; fetched =
   what the client received, and for S3 also what the server sent);
3. three ways to read one row group's projected columns, per store: ours (ranges from
   the cached footer, fetched concurrently), pyarrow ``pre_buffer`` over a file that
   fetches exactly what it is asked, and ``fsspec.parquet.open_parquet_file``;
4. planning over many small files (S3): seconds to build the dataset next to the
   seconds the same number of footer requests take one after another;
5. resuming deep in a row group (S3, files of 65,536-row groups with a page index, the
   numeric columns, no workers): seconds from ``load_state_dict`` to the first batch, bytes
   and requests, for a state saved at 90% of the epoch, read in two rounds (the page indexes,
   then the pages from the saved row's: the default past ``REMOTE_CUT_MIN_BYTES``) and in one
   (the whole column chunks with their page indexes), next to a fresh start's first batch;
   every object read is delayed by ``--latency`` seconds, a network's round trip.

The servers are emulators on loopback: they measure request counts and server CPU,
not network latency or bandwidth. Writes JSON to benchmarks/results/<name>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import pyarrow.parquet as pq  # noqa: E402
import servers  # noqa: E402  (sets GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT before gcsfs loads)
from generate import ensure_dataset, rows_for  # noqa: E402

from torch_dataloader_utils import StructuredDataset  # noqa: E402
from torch_dataloader_utils.formats import parquet  # noqa: E402
from torch_dataloader_utils.formats.io import RangeFile  # noqa: E402
from torch_dataloader_utils.read import prefetch  # noqa: E402
from torch_dataloader_utils.storage.remote import RemoteStore, open_store  # noqa: E402

PROJECTION = ["id", "label"]
PREFIX = "bench"


def _epoch(path: str, options: dict | None, workers: int, columns: list[str] | None = None) -> dict:
    start = time.perf_counter()
    loader, dataset = StructuredDataset.create_dataloader(
        path, batch_size=4096, num_workers=workers, shuffle=True, columns=columns, storage_options=options
    )
    planned = time.perf_counter()
    rows = sum(len(batch["id"]) for batch in loader)
    done = time.perf_counter()
    return {"plan_s": planned - start, "epoch_s": done - planned, "rows": rows, "rows_per_s": rows / (done - planned)}


def _needed(local_paths: list[str], columns: list[str] | None) -> int:
    """Projected column chunks of every row group plus every footer."""
    total = 0
    for path in local_paths:
        meta = pq.read_metadata(path)
        total += meta.serialized_size + 8
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                name = group.column(c).path_in_schema
                if columns is None or any(name == col or name.startswith(col + ".") for col in columns):
                    total += group.column(c).total_compressed_size
    return total


def _bytes(store: servers.Store, local_paths: list[str], columns: list[str] | None) -> dict:
    sent_before = store.server.faults.counters()[0] if store.server.faults else None
    dataset = StructuredDataset(store.url(PREFIX), batch_size=4096, num_workers=0, columns=columns, storage_options=store.options)
    rows = sum(len(batch["id"]) for batch in dataset)
    fs: RemoteStore = dataset._catalog.fs
    needed = _needed(local_paths, columns)
    out = {"rows": rows, "needed": needed, "fetched": fs.stats["bytes"], "requests": fs.stats["requests"]}
    out["fetched_ratio"] = out["fetched"] / needed
    if sent_before is not None:
        out["server_sent"] = store.server.faults.counters()[0] - sent_before
        out["server_ratio"] = out["server_sent"] / needed
    return out


# ------------------------------------------------------------------ read paths for one row group
def _ours(store: RemoteStore, path: str, footer: Any, group: int, columns: list[str] | None) -> int:
    return parquet.PARQUET.open(store, path, footer, use_threads=True).read_unit(group, columns).num_rows


def _pre_buffer(store: RemoteStore, path: str, footer: Any, group: int, columns: list[str] | None) -> int:
    source = RangeFile(store, path)  # nothing prefetched: every read pyarrow issues is one request
    reader = pq.ParquetFile(source, metadata=_metadata(footer), pre_buffer=True)
    return reader.read_row_group(group, columns=columns).num_rows


def _fsspec(store: RemoteStore, path: str, footer: Any, group: int, columns: list[str] | None) -> int:
    import fsspec.parquet

    with fsspec.parquet.open_parquet_file(
        path, fs=store.fs, columns=columns, row_groups=[group], engine="pyarrow", footer_sample_size=64 * 1024
    ) as handle:
        return pq.ParquetFile(handle).read_row_group(group, columns=columns).num_rows


def _metadata(footer: Any) -> pq.FileMetaData:
    """pyarrow's footer of a catalog's footer (a remote file's is kept as its Thrift bytes)."""
    return footer.parsed() if hasattr(footer, "parsed") else footer


READ_PATHS: dict[str, Callable] = {"ours": _ours, "pre_buffer": _pre_buffer, "fsspec_open_parquet_file": _fsspec}


def _read_paths(store: servers.Store, repeats: int = 5) -> dict:
    remote = open_store(store.fs, None)
    dataset = StructuredDataset(store.url(PREFIX), num_workers=0, storage_options=store.options)
    catalog = dataset._catalog
    remote.register(catalog.files)
    entry, footer = catalog.files[0], catalog.footers[0]
    results: dict = {}
    faults = store.server.faults
    for label, columns in (("projection", PROJECTION), ("all", None)):
        times: dict = {name: [] for name in READ_PATHS}
        sent: dict = {name: 0 for name in READ_PATHS}
        for _ in range(repeats):
            for group in range(_metadata(footer).num_row_groups):
                for name, read in READ_PATHS.items():  # interleaved: load drifts hit all paths alike
                    before = faults.counters()[0] if faults else 0
                    start = time.perf_counter()
                    read(remote, entry.fs_path, footer, group, columns)
                    times[name].append(time.perf_counter() - start)
                    if faults:
                        sent[name] += faults.counters()[0] - before
        for name in READ_PATHS:
            results[f"{label}/{name}"] = {
                "median_ms": 1000 * statistics.median(times[name]),
                "server_bytes_per_group": sent[name] / len(times[name]) if faults else None,
            }
    return results


def _planning(store: servers.Store, files: int, latency: float = 0.03) -> dict:
    """Plan ``files`` tiny files; compare with one request's latency times ``files``. Then read
    them (one epoch, shuffled, in this process) with their units decoded ahead (read/prefetch.py)
    and one file at a time.

    Every object read is delayed by ``latency`` seconds in the server (a network's round
    trip; moto alone answers from loopback in a few ms of its own CPU)."""
    import io

    import pyarrow as pa

    sink = io.BytesIO()
    pq.write_table(pa.table({"id": list(range(10))}), sink)
    blob = sink.getvalue()
    fs = store.fs
    fs.pipe({f"{servers.BUCKET}/many/part-{i:05d}.parquet": blob for i in range(files)})
    fs.invalidate_cache()
    store.server.faults.inject("stall", -1, stall_seconds=latency)
    default = prefetch.UNIT_BYTES
    try:
        start = time.perf_counter()
        dataset = StructuredDataset(store.url("many"), num_workers=0, storage_options=store.options)
        planned = time.perf_counter() - start
        assert len(dataset.files) == files
        probe = min(files, 50)
        start = time.perf_counter()
        for i in range(probe):
            fs.cat_file(f"{servers.BUCKET}/many/part-{i:05d}.parquet", start=0, end=len(blob))
        one = (time.perf_counter() - start) / probe
        epochs = {}
        for mode, unit_bytes in (("decoded ahead", prefetch.UNIT_BYTES), ("one file at a time", -1)):
            prefetch.UNIT_BYTES = unit_bytes
            loader, _ = StructuredDataset.create_dataloader(store.url("many"), storage_options=store.options, num_workers=0, shuffle=True, batch_size=1000)
            start = time.perf_counter()
            assert sum(len(batch["id"]) for batch in loader) == 10 * files
            epochs[mode] = time.perf_counter() - start
    finally:
        prefetch.UNIT_BYTES = default
        store.server.faults.clear()
    return {
        "files": files,
        "latency_s": latency,
        "plan_s": planned,
        "one_request_s": one,
        "serial_estimate_s": one * files,
        "speedup": one * files / planned,
        "epoch_s": epochs,
    }


RESUME_COLUMNS = ["id", "label", "feat"]


def _first_batch(url: str, options: dict, state: dict | None) -> dict:
    """A new dataset (planned before the clock) that loads ``state``; seconds to its first batch,
    and the bytes and requests that took."""
    dataset = StructuredDataset(url, batch_size=1024, num_workers=0, columns=RESUME_COLUMNS, storage_options=options)
    stats = dataset._catalog.fs.stats
    before = (stats["bytes"], stats["requests"])
    start = time.perf_counter()
    if state is not None:
        dataset.load_state_dict(state)
    next(iter(dataset))
    return {"first_batch_s": time.perf_counter() - start, "bytes": stats["bytes"] - before[0], "requests": stats["requests"] - before[1]}


def _resume(store: servers.Store, paths: list[str], latency: float, repeats: int) -> dict:
    upload = tempfile.mkdtemp()
    try:
        for path in paths:
            os.link(path, os.path.join(upload, os.path.basename(path)))
        store.upload(upload, "resume")
    finally:
        shutil.rmtree(upload, ignore_errors=True)
    url = store.url("resume")
    dataset = StructuredDataset(url, batch_size=1024, num_workers=0, columns=RESUME_COLUMNS, storage_options=store.options)
    batches, state = dataset.num_batches(), None
    for index, _ in enumerate(dataset):
        if index + 1 == batches * 9 // 10:
            state = dataset.state_dict()
            break
    modes = {"fresh start": (None, parquet.REMOTE_CUT_MIN_BYTES), "resume, two rounds": (state, 0), "resume, one round": (state, 1 << 60)}
    runs: dict = {name: [] for name in modes}
    default = parquet.REMOTE_CUT_MIN_BYTES
    store.server.faults.inject("stall", -1, stall_seconds=latency)
    try:
        for _ in range(repeats):
            for name, (saved, threshold) in modes.items():  # interleaved
                parquet.REMOTE_CUT_MIN_BYTES = threshold
                runs[name].append(_first_batch(url, store.options, saved))
    finally:
        parquet.REMOTE_CUT_MIN_BYTES = default
        store.server.faults.clear()
    medians = {name: {key: statistics.median(run[key] for run in results) for key in results[0]} for name, results in runs.items()}
    return {"latency_s": latency, "modes": medians}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=0.1, help="decoded size of the dataset (GiB)")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--row-group-rows", type=int, default=4096)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--stores", default="s3,gcs,azure")
    parser.add_argument("--rounds", type=int, default=3, help="epochs per location (best is reported)")
    parser.add_argument("--plan-files", type=int, default=1000, help="files for the planning measurement (S3)")
    parser.add_argument("--resume-rows", type=int, default=300_000, help="rows per file (2 files) for the resume measurement; 0 skips it")
    parser.add_argument("--latency", type=float, default=0.03, help="seconds added to every object read in the resume measurement")
    parser.add_argument("--name", default="object_stores")
    args = parser.parse_args(argv)

    root = os.path.join(tempfile.gettempdir(), "tdu-bench-objstores")
    local_paths = ensure_dataset(root, args.files, rows_for(args.size_gb, args.files), args.row_group_rows)
    disk_bytes = sum(os.path.getsize(p) for p in local_paths)
    upload = tempfile.mkdtemp()
    for path in local_paths:
        os.link(path, os.path.join(upload, os.path.basename(path)))
    report: dict = {"files": len(local_paths), "disk_bytes": disk_bytes, "workers": args.workers, "epoch": {}, "bytes": {}, "read_paths": {}}
    print(f"{len(local_paths)} files, {disk_bytes / 2**20:.1f} MiB", file=sys.stderr)
    registry: dict = {}
    try:
        stores = {name: servers.get_store(name, registry) for name in args.stores.split(",")}
        locations = {"local": (root, None)}
        for name, store in stores.items():
            store.upload(upload, PREFIX)
            locations[name] = (store.url(PREFIX), store.options)
        runs: dict = {name: [] for name in locations}
        for _ in range(args.rounds + 1):  # the first round warms up servers, imports and page cache
            for name, (path, options) in locations.items():  # interleaved, so load drifts hit all alike
                runs[name].append(_epoch(path, options, args.workers))
        for name, results in runs.items():
            best = min(results[1:], key=lambda r: r["epoch_s"])
            report["epoch"][name] = {**best, "epoch_s_all": [r["epoch_s"] for r in results[1:]]}
        for name, store in stores.items():
            report["bytes"][name] = {"all": _bytes(store, local_paths, None), "projection": _bytes(store, local_paths, PROJECTION)}
            report["read_paths"][name] = _read_paths(store)
            if name == "s3" and args.plan_files:
                report["planning"] = _planning(store, args.plan_files)
            if name == "s3" and args.resume_rows:
                resume_files = ensure_dataset(os.path.join(tempfile.gettempdir(), "tdu-bench-resume"), 2, args.resume_rows, 65536)
                report["resume"] = _resume(store, resume_files, args.latency, args.rounds + 2)
    finally:
        for store in registry.values():
            store.server.stop()
        shutil.rmtree(upload, ignore_errors=True)
    _print(report)
    out = os.path.join(HERE, "results", f"{args.name}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as handle:
        json.dump(report, handle, indent=2)
    print(f"wrote {out}", file=sys.stderr)


def _print(report: dict) -> None:
    local = report["epoch"]["local"]["rows_per_s"]
    print("| location | plan s | epoch s | rows/s | vs local |\n|---|---|---|---|---|")
    for name, row in report["epoch"].items():
        print(f"| {name} | {row['plan_s']:.2f} | {row['epoch_s']:.2f} | {row['rows_per_s']:,.0f} | {row['rows_per_s'] / local:.2f} |")
    print("\n| store | columns | needed MiB | fetched / needed | server sent / needed | requests |\n|---|---|---|---|---|---|")
    for name, sets in report["bytes"].items():
        for label, row in sets.items():
            server = f"{row['server_ratio']:.3f}" if "server_ratio" in row else "-"
            print(f"| {name} | {label} | {row['needed'] / 2**20:.2f} | {row['fetched_ratio']:.3f} | {server} | {row['requests']} |")
    print("\n| store | read path | projection ms | all columns ms | S3 bytes/row group (projection) |\n|---|---|---|---|---|")
    for name, paths in report["read_paths"].items():
        for path in READ_PATHS:
            projection, full = paths[f"projection/{path}"], paths[f"all/{path}"]
            sent = projection["server_bytes_per_group"]
            print(f"| {name} | {path} | {projection['median_ms']:.1f} | {full['median_ms']:.1f} | {'-' if sent is None else f'{sent:,.0f}'} |")
    resume = report.get("resume")
    if resume:
        print(f"\n| S3, {1000 * resume['latency_s']:.0f} ms added per read | first batch s | MB fetched | requests |\n|---|---|---|---|")
        for name, row in resume["modes"].items():
            print(f"| {name} | {row['first_batch_s']:.3f} | {row['bytes'] / 1e6:.1f} | {row['requests']:.0f} |")
    plan = report.get("planning")
    if plan:
        print(
            f"\nplanning {plan['files']} files on S3 with {1000 * plan['latency_s']:.0f} ms added per read: {plan['plan_s']:.2f} s; one footer request takes "
            f"{1000 * plan['one_request_s']:.1f} ms, {plan['serial_estimate_s']:.1f} s in series ({plan['speedup']:.0f}x); one shuffled epoch "
            + ", ".join(f"{mode} {seconds:.2f} s" for mode, seconds in plan["epoch_s"].items())
        )


if __name__ == "__main__":
    main()
