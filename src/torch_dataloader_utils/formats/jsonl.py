"""JSON Lines (one JSON object per line; also .ndjson and .json): units are byte ranges of whole
lines (_text.py), parsed with pyarrow.json against the schema found at planning."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import pyarrow as pa
from pyarrow import json

from . import FORMATS
from ._text import LONG_RECORD, TextFooter, TextFormat
from ._text_index import RecordScanner
from ._text_options import check_values, sort_options

_GROUPS = {"read": ("block_size",), "parse": ("explicit_schema", "unexpected_field_behavior")}


class JsonParse(NamedTuple):
    read: dict[str, Any]
    parse: dict[str, Any]


class JsonLinesFormat(TextFormat):
    """Newline-delimited JSON files (``FileFormat``); ``json_options`` as in docs/formats.md."""

    name = "jsonl"
    suffixes = FORMATS["jsonl"].suffixes
    numbers_rows_by_block = True
    schema_advice = (
        "JSON types are inferred per file from its first block: give every file one schema with "
        "json_options={'explicit_schema': pyarrow.schema([...])}."
    )

    miscount_hint = (
        ", or it is not JSON Lines: an object spread over several lines (pretty-printed JSON) was counted once per "
        "line holding '{'. Write one object per line (pandas: to_json(path, orient='records', lines=True))"
    )

    def check_options(self, options: dict) -> dict:
        if "newlines_in_values" in options:
            raise ValueError("json option 'newlines_in_values' is not accepted: JSON Lines holds one record per line")
        if options.get("unexpected_field_behavior") == "infer":
            raise ValueError(
                "json option unexpected_field_behavior='infer' is not accepted: a file's fields are fixed at planning, from "
                "its first block, so a field that first appears later would be left out of some batches. Pass "
                "json_options={'explicit_schema': pyarrow.schema([...])} with every field, or 'ignore' to leave such "
                "fields out ('error', the default here, raises at the first one)"
            )
        check_values("json", sort_options("json", options, _GROUPS), {"read": json.ReadOptions, "parse": json.ParseOptions})
        return options

    def file_parse(self, path: str) -> JsonParse:
        groups = sort_options("json", self.options, _GROUPS)
        return JsonParse(groups["read"], groups["parse"])

    def scanner(self, parse: JsonParse) -> RecordScanner:
        # a line without an object is blank: pyarrow skips it; a lone carriage return ends a line, as for pyarrow
        return RecordScanner(None, 0, marker=ord("{"), returns=True)

    def infer_schema(self, stream: Any, parse: JsonParse, count_rows: bool) -> tuple[pa.Schema, int | None]:
        options = json.ParseOptions(**{"unexpected_field_behavior": "error", **parse.parse})  # pyarrow's default would infer
        try:
            reader = json.open_json(stream, read_options=json.ReadOptions(**parse.read, use_threads=False), parse_options=options)
            return reader.schema, sum(batch.num_rows for batch in reader) if count_rows else None
        except pa.ArrowInvalid as error:
            raise _advice(error, parse) from error

    def _options(self, footer: TextFooter, use_threads: bool) -> dict[str, Any]:
        parse: JsonParse = footer.parse
        options = {"unexpected_field_behavior": "error", **parse.parse, "explicit_schema": footer.schema}
        return {"read_options": json.ReadOptions(**parse.read, use_threads=use_threads), "parse_options": json.ParseOptions(**options)}

    def parse(self, data: Any, footer: TextFooter, columns: list[str] | None, use_threads: bool) -> pa.Table:
        try:
            table = json.read_json(_source(data), **self._options(footer, use_threads))
        except pa.ArrowInvalid as error:
            raise _advice(error, footer.parse) from error
        return table if columns is None else table.select(columns)

    def parse_blocks(self, data: Any, footer: TextFooter, columns: list[str] | None) -> Iterator[pa.Table]:
        try:
            for batch in json.open_json(_source(data), **self._options(footer, False)):
                table = pa.Table.from_batches([batch])
                yield table if columns is None else table.select(columns)
        except pa.ArrowInvalid as error:
            raise _advice(error, footer.parse) from error


def _source(data: Any) -> Any:
    return pa.BufferReader(data) if isinstance(data, pa.Buffer) else data


def _advice(error: Exception, parse: JsonParse) -> pa.ArrowInvalid:
    text, explicit = str(error), "explicit_schema" in parse.parse
    if "straddl" in text:
        return pa.ArrowInvalid(f"{error}. {LONG_RECORD.format(options='json_options')}")
    if "changed from" in text and explicit:  # a value of another JSON type than its column's
        return pa.ArrowInvalid(
            f"{error}. A value of that column has another JSON type than the column's type in json_options' explicit_schema "
            "(Spark writes a double's NaN and Infinity as strings): give the column a type that holds every value (such as "
            "pyarrow.string()), or leave it out of explicit_schema with {'unexpected_field_behavior': 'ignore'}"
        )
    if "changed from" in text:
        return pa.ArrowInvalid(
            f"{error}. The column's type was inferred from the file's first block (json_options block_size), and a later "
            "value has another JSON type: pass json_options={'explicit_schema': pyarrow.schema([...])} with a type that "
            "holds every value (such as pyarrow.string()), or leave the column out"
        )
    if "unexpected field" not in text:
        return pa.ArrowInvalid(f"{error}. The record is not valid JSON (a truncated or damaged line)")
    if explicit:
        return pa.ArrowInvalid(
            f"{error}. The file does not fit json_options' explicit_schema: add the field (with its type) to it, or pass "
            "{'unexpected_field_behavior': 'ignore'} to leave fields out that it lacks"
        )
    return pa.ArrowInvalid(
        f"{error}. The fields and types of each file are inferred from its first block (json_options block_size): "
        "pass json_options={'explicit_schema': pyarrow.schema([...])}, or {'unexpected_field_behavior': 'ignore'} "
        "to leave fields out that the first block lacks"
    )

JSONL = JsonLinesFormat()
