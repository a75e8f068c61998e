"""ORC: the tail and stripe footers decoded by formats/orc_tail.py, and columns read by name in formats/orc.py."""

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pytest

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.formats._orc_tail import _decompress, _fields, read_tail

LZ4, ZSTD = 4, 5  # ORC's CompressionKind numbers


def _chunk(payload: bytes) -> bytes:
    """One ORC compression chunk: a 3-byte little-endian header (length << 1, not 'original')."""
    header = len(payload) << 1
    return bytes([header & 0xFF, (header >> 8) & 0xFF, (header >> 16) & 0xFF]) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _sample_blocks() -> list[bytes]:
    rng = np.random.default_rng(3)
    return [
        b"",
        b"x",
        b"abc" * 5000,  # long matches (length fields continue in extra bytes)
        rng.integers(0, 256, 70_000, dtype=np.uint8).tobytes(),  # incompressible: long literal runs
        b"".join(f"column_{i:05d}".encode() for i in range(3000)),
    ]


@pytest.mark.parametrize("block", range(len(_sample_blocks())))
def test_lz4_chunks_decode_to_exactly_their_bytes(block):
    """pyarrow's lz4_raw codec returns as many bytes as asked for, so the decoded length must be exact."""
    raw = _sample_blocks()[block]
    compressed = pa.Codec("lz4_raw").compress(raw, asbytes=True)
    assert _decompress(_chunk(compressed) * 2, LZ4) == raw * 2


@pytest.mark.parametrize("block", range(len(_sample_blocks())))
def test_zstd_chunks_decode_without_a_stated_size(block):
    """A frame written as a stream does not state its decoded size (Java writers' may not either)."""
    raw = _sample_blocks()[block]
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as stream:
        stream.write(raw)
    assert _decompress(_chunk(sink.getvalue().to_pybytes()), ZSTD) == raw


def _with_lz4_footer(source: str, target: str) -> None:
    """Rewrite an ORC file that pyarrow wrote with compression="lz4" (which stores every chunk as
    'original') so that its footer is one LZ4-compressed chunk, as Java ORC writers store it."""
    data = open(source, "rb").read()
    ps_len = data[-1]
    fields = list(_fields(data[-1 - ps_len : -1]))
    postscript = dict(fields)
    assert postscript[2] == LZ4
    stored = data[-1 - ps_len - postscript[1] : -1 - ps_len]
    raw, pos = b"", 0
    while pos < len(stored):
        length = (stored[pos] | stored[pos + 1] << 8 | stored[pos + 2] << 16) >> 1
        raw += stored[pos + 3 : pos + 3 + length]
        pos += 3 + length
    footer = _chunk(pa.Codec("lz4_raw").compress(raw, asbytes=True))
    assert len(footer) < len(raw)
    rebuilt = b""
    for number, value in fields:
        if number == 1:
            value = len(footer)
        if isinstance(value, int):
            rebuilt += _varint(number << 3) + _varint(value)
        else:
            rebuilt += _varint(number << 3 | 2) + _varint(len(value)) + bytes(value)
    with open(target, "wb") as out:
        out.write(data[: -1 - ps_len - postscript[1]] + footer + rebuilt + bytes([len(rebuilt)]))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_file_with_an_lz4_compressed_footer_is_read_whole(tmp_path, num_workers):
    rows = 3000
    table = pa.table({"id": np.arange(rows), **{f"a_repetitive_column_name_{i:03d}": np.arange(rows, dtype=np.int32) for i in range(40)}})
    orc.write_table(table, tmp_path / "src.orc", compression="lz4", stripe_size=64 * 1024)
    (tmp_path / "data").mkdir()
    _with_lz4_footer(str(tmp_path / "src.orc"), str(tmp_path / "data" / "a.orc"))
    path = str(tmp_path / "data" / "a.orc")
    assert orc.ORCFile(path).read().equals(table)  # a valid file
    with open(path, "rb") as source:
        tail = read_tail(source, len(open(path, "rb").read()))
    assert sum(stripe.rows for stripe in tail.stripes) == rows and len(tail.column_ids) == len(table.columns)
    loader, _ = StructuredDataset.create_dataloader(path, format="orc", batch_size=256, num_workers=num_workers, columns=["id", "a_repetitive_column_name_007"])
    ids = sorted(i for batch in loader for i in batch["id"].tolist())
    assert ids == list(range(rows))


def _dotted_table(rows: int = 8) -> pa.Table:
    """A top-level column named like a path into the struct column next to it."""
    return pa.table(
        {
            "id": np.arange(rows),
            "meta.lang": [f"lang{i}" for i in range(rows)],
            "meta": pa.array([{"lang": "wrong"}] * rows),
            "meta.score": np.arange(rows, dtype=np.float64) / 2,
        }
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_dotted_column_name_reads_that_column_not_a_struct_field(tmp_path, num_workers):
    table = _dotted_table()
    orc.write_table(table, tmp_path / "f.orc")
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), format="orc", batch_size=8, num_workers=num_workers, columns=["id", "meta.lang", "meta.score"])
    (batch,) = list(loader)
    assert batch["meta.lang"] == table.column("meta.lang").to_pylist()
    assert batch["meta.score"].tolist() == table.column("meta.score").to_pylist()


def test_a_timestamp_past_nanoseconds_is_named_without_the_damaged_file_advice(tmp_path):
    import datetime

    from torch_dataloader_utils.errors import DataReadError

    stamps = pa.array([datetime.datetime(2024, 1, 1), datetime.datetime(9999, 12, 31)], pa.timestamp("us"))
    orc.write_table(pa.table({"id": [0, 1], "ts": stamps}), str(tmp_path / "x.orc"))
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), format="orc", batch_size=3, num_workers=0)
    with pytest.raises(DataReadError, match=r"x\.orc .*nanoseconds cannot hold .*columns=") as error:
        list(loader)
    assert "damaged" not in str(error.value) and "on_error" not in str(error.value)
    (batch,) = list(StructuredDataset.create_dataloader(str(tmp_path), format="orc", batch_size=3, num_workers=0, columns=["id"])[0])
    assert batch["id"].tolist() == [0, 1]


@pytest.mark.parametrize("damage", ["wire type", "footer length"])
def test_a_tail_that_does_not_decode_says_so_naming_the_file(tmp_path, damage):
    """The message was the decoder's detail alone: ': 1.', 'index out of range', 'invalid literal for int()'."""
    path = tmp_path / "damaged.orc"
    orc.write_table(pa.table({"id": np.arange(100)}), str(path), compression="uncompressed")
    data = bytearray(path.read_bytes())
    ps_len = data[-1]
    postscript = dict(_fields(bytes(data[-1 - ps_len : -1])))
    footer_end = len(data) - 1 - ps_len
    if damage == "wire type":
        data[footer_end - int(postscript[1]) : footer_end] = b"\x0f" * int(postscript[1])  # field 1, wire type 7
    else:
        data[-1 - ps_len : -1 - ps_len + 2] = bytes([0x0A, 0x00])  # footerLength (field 1) as 0 bytes instead of a varint
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"damaged\.orc: its tail \(postscript and footer\) does not decode as ORC's: \w+"):
        StructuredDataset(str(path), format="orc", num_workers=0)
