"""CSV (and tab-separated .tsv): units are byte ranges of whole records (_text.py), parsed with
pyarrow.csv using the column names and types found at planning."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import pyarrow as pa
from pyarrow import csv

from . import FORMATS, TEXT_PACKINGS
from ._text import LONG_RECORD, TextFooter, TextFormat
from ._text_index import RecordIndex, RecordScanner
from ._text_options import check_values, sort_options

_GROUPS = {
    "read": ("block_size", "skip_rows", "column_names", "autogenerate_column_names"),
    "parse": ("delimiter", "quote_char", "double_quote", "escape_char", "newlines_in_values", "ignore_empty_lines"),
    "convert": (
        "check_utf8", "column_types", "null_values", "true_values", "false_values", "decimal_point", "strings_can_be_null",
        "quoted_strings_can_be_null", "auto_dict_encode", "auto_dict_max_cardinality", "timestamp_parsers",
    ),
}  # fmt: skip
_TSV_SUFFIXES = tuple(f".tsv{packed}" for packed in TEXT_PACKINGS)


class CsvParse(NamedTuple):
    """How one CSV file is parsed: pyarrow's options as dicts (picklable)."""

    read: dict[str, Any]
    parse: dict[str, Any]
    convert: dict[str, Any]


def _advice(error: Exception, names: Sequence[str] | None = None) -> pa.ArrowInvalid:
    """The error, with the fix for a value that does not fit the type inferred from the first
    block; ``names``: the file's columns, to name the one pyarrow gives by number."""
    if "straddl" in str(error):
        return pa.ArrowInvalid(f"{error}. {LONG_RECORD.format(options='csv_options')}")
    if "conversion error" not in str(error):
        return pa.ArrowInvalid(str(error))
    number = re.search(r"In CSV column #(\d+)", str(error))
    name = names[int(number.group(1))] if number and names and int(number.group(1)) < len(names) else None
    return pa.ArrowInvalid(
        f"{error}{'' if name is None else f' (column {name!r})'}. Column types are inferred from the first block of each file "
        f"(csv_options block_size, default 1 MiB): name the column's type, e.g. csv_options={{'column_types': {{{name or '<column>'!r}: 'string'}}}}"
    )


class CsvFormat(TextFormat):
    """CSV files (``FileFormat``); ``csv_options`` as in docs/formats.md."""

    name = "csv"
    suffixes = FORMATS["csv"].suffixes
    schema_advice = (
        "CSV column types are inferred per file from its first block: name one type for the column with "
        "csv_options={'column_types': {'<column>': 'double'}} (or 'string')."
    )

    miscount_hint = (
        ", or its records are not what the planning scan counted (it follows pyarrow's quoting and escape_char; "
        "docs/formats.md, Limits): please report the file's first lines and csv_options"
    )

    def check_options(self, options: dict) -> dict:
        check_values("csv", sort_options("csv", options, _GROUPS), {"read": csv.ReadOptions, "parse": csv.ParseOptions, "convert": csv.ConvertOptions})
        return options

    def file_parse(self, path: str) -> CsvParse:
        groups = sort_options("csv", self.options, _GROUPS)
        if "delimiter" not in groups["parse"] and path.lower().endswith(_TSV_SUFFIXES):
            groups["parse"]["delimiter"] = "\t"
        return CsvParse(groups["read"], groups["parse"], groups["convert"])

    def whole_file(self, parse: CsvParse) -> bool:
        return bool(parse.parse.get("escape_char"))

    def scanner(self, parse: CsvParse) -> RecordScanner:
        quote = parse.parse.get("quote_char", '"')
        header = not parse.read.get("column_names") and not parse.read.get("autogenerate_column_names")
        return RecordScanner(
            ord(quote) if quote else None,
            int(header),
            count_empty=not parse.parse.get("ignore_empty_lines", True),
            returns=True,
            raw_skip=int(parse.read.get("skip_rows", 0)),
            escape=ord(escape) if (escape := parse.parse.get("escape_char")) else None,
            delimiter=ord(parse.parse.get("delimiter", ",")),
            double_quote=bool(parse.parse.get("double_quote", True)),
        )

    def with_index(self, parse: CsvParse, index: RecordIndex) -> CsvParse:
        if index.quoted_newlines and "newlines_in_values" not in parse.parse:
            return parse._replace(parse={**parse.parse, "newlines_in_values": True})
        return parse

    def infer_schema(self, stream: Any, parse: CsvParse, count_rows: bool) -> tuple[pa.Schema, int | None]:
        reader = None
        try:
            reader = csv.open_csv(
                stream,
                read_options=csv.ReadOptions(**parse.read, use_threads=False),
                parse_options=csv.ParseOptions(**parse.parse),
                convert_options=csv.ConvertOptions(**parse.convert),
            )
            return reader.schema, sum(batch.num_rows for batch in reader) if count_rows else None
        except pa.ArrowInvalid as error:
            raise _advice(error, None if reader is None else reader.schema.names) from error

    def _options(self, footer: TextFooter, columns: list[str] | None, use_threads: bool) -> dict[str, Any]:
        parse: CsvParse = footer.parse
        schema = footer.schema
        read = {k: v for k, v in parse.read.items() if k == "block_size"}
        convert = {**parse.convert, "column_types": {field.name: field.type for field in schema}}
        if columns is not None:  # (no columns: the first, for the row count)
            convert["include_columns"] = columns or schema.names[:1]
        return {
            "read_options": csv.ReadOptions(**read, column_names=schema.names, use_threads=use_threads),
            "parse_options": csv.ParseOptions(**parse.parse),
            "convert_options": csv.ConvertOptions(**convert),
        }

    def skips_empty_lines(self, parse: CsvParse) -> bool:
        return bool(parse.parse.get("ignore_empty_lines", True))

    def parse(self, data: Any, footer: TextFooter, columns: list[str] | None, use_threads: bool) -> pa.Table:
        try:
            table = csv.read_csv(_source(data), **self._options(footer, columns, use_threads))
        except pa.ArrowInvalid as error:
            raise _advice(error, footer.schema.names) from error
        return table if columns is None or columns else table.select([])

    def parse_blocks(self, data: Any, footer: TextFooter, columns: list[str] | None) -> Iterator[pa.Table]:
        try:
            for batch in csv.open_csv(_source(data), **self._options(footer, columns, False)):
                table = pa.Table.from_batches([batch])
                yield table if columns is None or columns else table.select([])
        except pa.ArrowInvalid as error:
            raise _advice(error, footer.schema.names) from error


def _source(data: Any) -> Any:
    return pa.BufferReader(data) if isinstance(data, pa.Buffer) else data

CSV = CsvFormat()
