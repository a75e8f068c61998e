"""Deterministic benchmark data: N Parquet (or ORC) files of id / label / feat / text rows.

Columns: ``id`` int64 (0..rows-1, unique across the dataset, in file order), ``label`` int32,
``feat`` fixed_size_list<float32>[64] (ORC: list<float32>, ORC has no fixed-size list),
``text`` ~200-character strings of words. zstd compression. File i depends only on
(i, rows_per_file, row_group_rows), so a dataset of 4N files starts with the N-file one.

    python benchmarks/generate.py OUT_DIR [--size-gb 1.0 | --small] [--files 8] \
        [--row-group-rows 65536] [--format parquet|orc|both]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq

FEAT_DIM = 64
TEXT_CHARS = 200
# decoded Arrow bytes per row: id 8 + label 4 + feat 256 + text ~200 chars + 4 offset bytes
ROW_BYTES = 8 + 4 + 4 * FEAT_DIM + TEXT_CHARS + 4
SMALL_GB = 0.05
_WORDS = np.array(
    "the of and to in is was for on that with as by at from it an be this are or his which had "
    "batch tensor row group stripe footer epoch worker shard resume checkpoint parquet orc arrow "
    "loader stream chunk window column float label feature vector token sample model train data".split()
)


def rows_for(size_gb: float, files: int) -> int:
    """Rows per file so that ``files`` files hold about ``size_gb`` GiB of decoded data."""
    return max(1, int(size_gb * (1 << 30) / ROW_BYTES / files))


def _text(rng: np.random.Generator, rows: int) -> pa.Array:
    """~200-char strings cut from one long run of random words (no per-row Python)."""
    lengths = rng.integers(TEXT_CHARS - 20, TEXT_CHARS + 21, rows)
    total = int(lengths.sum())
    words = rng.choice(_WORDS, total // 4 + 16)
    data = (" ".join(words.tolist())).encode()[:total]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.StringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(data))


def make_table(index: int, rows: int, fixed_list: bool = True) -> pa.Table:
    """Rows of file ``index`` (deterministic)."""
    rng = np.random.default_rng([20260511, index])
    ids = np.arange(index * rows, (index + 1) * rows, dtype=np.int64)
    values = pa.array(rng.standard_normal(rows * FEAT_DIM, dtype=np.float32))
    if fixed_list:
        feat = pa.FixedSizeListArray.from_arrays(values, FEAT_DIM)
    else:
        feat = pa.ListArray.from_arrays(pa.array(np.arange(0, rows * FEAT_DIM + 1, FEAT_DIM, dtype=np.int32)), values)
    label = rng.integers(0, 1000, rows, dtype=np.int32)
    return pa.table({"id": ids, "label": label, "feat": feat, "text": _text(rng, rows)})


def write_file(path: str, index: int, rows: int, row_group_rows: int, fmt: str, page_index: bool = True) -> None:
    """One file; Parquet with a page index unless ``page_index`` is False (Spark and parquet-mr
    write one by default, pyarrow when asked: resumes inside a row group seek with it)."""
    table = make_table(index, rows, fixed_list=fmt == "parquet")
    tmp = path + ".tmp"
    if fmt == "parquet":
        pq.write_table(table, tmp, row_group_size=row_group_rows, compression="zstd", write_page_index=page_index)
    else:
        orc.write_table(table, tmp, compression="zstd", stripe_size=row_group_rows * ROW_BYTES)
    os.replace(tmp, path)


def ensure_dataset(root: str, files: int, rows_per_file: int, row_group_rows: int, fmt: str = "parquet", page_index: bool = True) -> list[str]:
    """Write the files that are missing (or were made with other parameters); return their paths."""
    os.makedirs(root, exist_ok=True)
    manifest_path = os.path.join(root, "manifest.json")
    params = {"rows_per_file": rows_per_file, "row_group_rows": row_group_rows, "format": fmt, "page_index": page_index}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            if json.load(f) != params:
                for name in os.listdir(root):
                    if name.startswith("part-"):
                        os.remove(os.path.join(root, name))
    with open(manifest_path, "w") as f:
        json.dump(params, f)
    paths = []
    for index in range(files):
        path = os.path.join(root, f"part-{index:05d}.{fmt}")
        if not os.path.exists(path):
            write_file(path, index, rows_per_file, row_group_rows, fmt, page_index)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--size-gb", type=float, default=1.0, help="decoded size of the whole dataset (GiB)")
    parser.add_argument("--small", action="store_true", help=f"{SMALL_GB} GiB, for quick runs")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--row-group-rows", type=int, default=65536, help="Parquet row group / ORC stripe rows")
    parser.add_argument("--format", choices=["parquet", "orc", "both"], default="parquet")
    args = parser.parse_args(argv)
    size = SMALL_GB if args.small else args.size_gb
    rows = rows_for(size, args.files)
    for fmt in ["parquet", "orc"] if args.format == "both" else [args.format]:
        root = os.path.join(args.out, fmt) if args.format == "both" else args.out
        paths = ensure_dataset(root, args.files, rows, args.row_group_rows, fmt)
        for name in os.listdir(root):  # files of an earlier, larger --files: the directory holds exactly these
            if name.startswith("part-") and os.path.join(root, name) not in paths:
                os.remove(os.path.join(root, name))
        disk = sum(os.path.getsize(p) for p in paths)
        print(f"{fmt}: {len(paths)} files x {rows} rows in {root} ({disk / 2**20:.0f} MiB on disk)", file=sys.stderr)


if __name__ == "__main__":
    main()
