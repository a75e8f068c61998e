"""numpy and Arrow batches carried from a DataLoader worker to the main process in the worker's
shared buffers (runtime/transfer.py), as torch chunks are, instead of in a pickle.

In the worker each finished batch gives up its bytes: a numpy array of a fixed-size dtype its
data, an Arrow batch its IPC serialization (its own rows' bytes only, even for a slice). Those
bytes become the chunk's ``columns`` (one uint8 ``Joined`` each), which the transfer writes into
a recycled shared buffer, and the batch becomes a small ``Packed`` recipe. In the main process
the columns arrive as uint8 tensors viewing that buffer, and ``unpack`` rebuilds each batch as
views of them: ``.numpy()`` viewed as the array's dtype and shape, or the IPC message read
zero-copy by pyarrow. The buffer is released when the last such view is gone, as for torch
batches. Object arrays (strings, nested values) are Python objects and still travel pickled.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from .convert import Joined

#: output formats carried this way (without a transform: a transform's result is anything)
PACKED_FORMATS = ("numpy", "arrow")


@dataclass(frozen=True)
class _Array:
    key: str  # its bytes in the chunk's columns
    dtype: np.dtype
    shape: tuple[int, ...]


class _Schema:
    """An Arrow schema that crosses processes as its IPC message: pickling a ``pa.Schema``
    renames a fixed-size list's child field (``element`` -> ``item``), its IPC form keeps it."""

    __slots__ = ("data", "_schema")

    def __init__(self, schema: pa.Schema):
        self.data, self._schema = schema.serialize().to_pybytes(), schema

    def __getstate__(self) -> bytes:
        return self.data

    def __setstate__(self, data: bytes) -> None:
        self.data, self._schema = data, None

    @property
    def schema(self) -> pa.Schema:
        if self._schema is None:
            self._schema = pa.ipc.read_schema(pa.py_buffer(self.data))
        return self._schema


@dataclass(frozen=True)
class Packed:
    """A batch whose bytes travel in the chunk's columns: ``parts`` maps a numpy batch's column
    names to an ``_Array`` (or the object array itself), or holds an Arrow batch's
    ``(key, schema)``."""

    format: str
    parts: Any


def pack_batches(batches: list[Any], output_format: str) -> tuple[dict[str, Joined], list[Packed]]:
    """The bytes of ``batches`` (numpy dicts or RecordBatches) as uint8 ``Joined`` columns, and
    a recipe per batch."""
    columns: dict[str, Joined] = {}

    def carry(data: np.ndarray) -> str:
        key = str(len(columns))
        with warnings.catch_warnings():  # (a read-only array: the tensor is only copied from)
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.from_numpy(data.reshape(-1).view(np.uint8)) if data.size else torch.empty(0, dtype=torch.uint8)
        columns[key] = Joined(torch.uint8, (int(flat.numel()),), ((flat, 0),))
        return key

    packed = []
    schema: _Schema | None = None  # one object for the chunk's batches: pickled once with the chunk
    for batch in batches:
        if output_format == "arrow":
            if _has_dictionary(batch.schema):  # a bare batch message leaves out the dictionaries: a stream carries them
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, batch.schema) as writer:
                    writer.write_batch(batch)
                packed.append(Packed("arrow", (carry(np.frombuffer(sink.getvalue(), dtype=np.uint8)), None)))
                continue
            message = batch.serialize()
            schema = schema if schema is not None and schema.schema.equals(batch.schema, check_metadata=True) else _Schema(batch.schema)
            packed.append(Packed("arrow", (carry(np.frombuffer(message, dtype=np.uint8)), schema)))
            continue
        parts: dict[str, Any] = {}
        for name, array in batch.items():
            if array.dtype.hasobject:
                parts[name] = array
            else:
                data = np.ascontiguousarray(array)
                parts[name] = _Array(carry(data), data.dtype, data.shape)
        packed.append(Packed("numpy", parts))
    return columns, packed


def unpack(packed: Packed, columns: dict[str, torch.Tensor]) -> Any:
    """The batch of ``packed`` as views of ``columns`` (the chunk's received uint8 tensors)."""
    if packed.format == "arrow":
        key, schema = packed.parts
        if schema is None:
            return pa.ipc.open_stream(pa.py_buffer(columns[key].numpy())).read_next_batch()
        return pa.ipc.read_record_batch(pa.py_buffer(columns[key].numpy()), schema.schema)
    return {name: _array(part, columns) if isinstance(part, _Array) else part for name, part in packed.parts.items()}


def _has_dictionary(schema: pa.Schema) -> bool:
    def nested(kind: pa.DataType) -> bool:
        return pa.types.is_dictionary(kind) or any(nested(kind.field(i).type) for i in range(getattr(kind, "num_fields", 0)))

    return any(nested(field.type) for field in schema)


def _array(part: _Array, columns: dict[str, torch.Tensor]) -> np.ndarray:
    return columns[part.key].numpy().view(part.dtype).reshape(part.shape)
