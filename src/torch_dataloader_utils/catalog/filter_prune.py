"""Row filters at planning time: the filter checked against the data's schema, and the units
(row groups) whose statistics show that no row can match, which are then never read.

Pruning is conservative by construction: each unit's statistics become a *guarantee* (an
expression every row of the unit satisfies, e.g. ``a >= 3 and a <= 17``), and pyarrow's own
simplification decides whether the filter can be true under it; a unit is left out only when it
cannot. A unit without usable statistics (a file written without them, a column type whose
statistics are not trusted here) is always kept: the count of matching rows
(read/filtering.py) is exact either way, pruning only saves reading.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from ..formats._legacy_calendar import spark_hybrid_columns
from ..formats._orc_tail import read_stripe_statistics, read_tail
from ..formats.io import open_input

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    from ..formats._lazy import compute as pc  # imported when first used

_STATISTICS_THREADS = 16
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowFilter:
    """A dataset's row filter: the expression, the columns it reads, and its digest (saved in states)."""

    expression: pc.Expression
    columns: tuple[str, ...]
    digest: str
    dnf: Any = None  # the DNF list form it was given in (read/filter_eval.py evaluates it directly), else None
    identity: str = ""  # what makes two filters the same (``filter_identity``): keys of the counts kept

    @property
    def text(self) -> str:
        return str(self.expression)


def filter_identity(expression: pc.Expression) -> str:
    """What makes two filters the same: the expression's text and a digest of its serialized
    form. The text alone is not enough: pyarrow prints only the first and last 10 values of a
    longer value list, a duration without its unit, and a float32 literal as the float64 one."""
    return f"{expression}\nserialized {hashlib.sha256(pickle.dumps(expression)).hexdigest()}"


def row_filter(filters: Any, schema: pa.Schema | None) -> RowFilter:
    """``filters`` (a pyarrow.compute.Expression, or pyarrow's DNF list form) checked against the
    data's unified ``schema``; ValueError / TypeError naming what is wrong."""
    filters = dnf_sets_sorted(filters)
    expression = filter_expression(filters)
    if schema is None or not len(schema):
        raise ValueError(f"filters={expression} cannot apply: the files have no columns")
    columns = _referenced_columns(expression, schema)
    identity = filter_identity(expression)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return RowFilter(expression, columns, digest, dnf_form(filters), identity)


#: the operators of pyarrow's DNF list form (pyarrow.parquet.filters_to_expression)
DNF_OPERATORS = ("=", "==", "!=", "<", ">", "<=", ">=", "in", "not in")


def dnf_sets_sorted(filters: Any) -> Any:
    """The DNF list form with the values of each ``in`` / ``not in`` given as a set in a sorted
    list: a set's order depends on the process's string hashing, and the filter's identity (saved
    in states, compared across DDP ranks) on the order. Anything else is returned as it is."""
    if not isinstance(filters, (list, tuple)):
        return filters

    def sorted_values(item: Any) -> Any:
        if isinstance(item, (list, tuple)) and len(item) == 3 and isinstance(item[2], (set, frozenset)):
            try:
                values = sorted(item[2])
            except TypeError:  # values of several kinds
                values = sorted(item[2], key=repr)
            return (item[0], item[1], values)
        if isinstance(item, (list, tuple)) and item and isinstance(item[0], (list, tuple)):
            return [sorted_values(condition) for condition in item]
        return item

    return [sorted_values(item) for item in filters]


def dnf_form(filters: Any) -> tuple[tuple[tuple[str, str, Any], ...], ...] | None:
    """``filters`` as conjunctions of (column, op, value) on top-level columns, any one of which
    must hold; None when it is not in that form (an Expression) or uses anything else."""
    if not isinstance(filters, (list, tuple)) or not filters:
        return None
    groups = filters if all(isinstance(item, (list, tuple)) and item and isinstance(item[0], (list, tuple)) for item in filters) else [filters]
    form = []
    for group in groups:
        conjunction = []
        for condition in group:
            if not (isinstance(condition, (list, tuple)) and len(condition) == 3 and isinstance(condition[0], str)):
                return None
            column, op, value = condition
            if op not in DNF_OPERATORS or (op in ("in", "not in") and not isinstance(value, (list, tuple))):
                return None
            conjunction.append((column, op, value))
        form.append(tuple(conjunction))
    return tuple(form)


_POSITIONAL = re.compile(r"FieldPath\(\d")


def filter_expression(filters: Any) -> pc.Expression:
    """``filters`` as an Expression: itself, or pyarrow's DNF list form converted; ValueError /
    TypeError naming what is wrong."""
    if isinstance(filters, pc.Expression):
        if _POSITIONAL.search(str(filters)):  # a column by position: the files' positions differ from the dataset's
            raise ValueError(f"filters {filters} refer to a column by position (pc.field(0)); name it instead, e.g. pc.field('label')")
        return filters
    if isinstance(filters, (list, tuple)) and filters:
        try:
            return pq.filters_to_expression(list(dnf_sets_sorted(filters)))
        except (TypeError, ValueError, pa.ArrowException) as error:
            raise ValueError(
                f"filters must be a pyarrow.compute.Expression or pyarrow's DNF list form, e.g. [('label', '<', 10)] or "
                f"[[('a', '=', 1)], [('b', 'in', [2, 3])]]; {filters!r:.120} is neither: {error}"
            ) from error
    raise TypeError(
        f"filters must be a pyarrow.compute.Expression (e.g. pc.field('label') < 10) or a non-empty DNF list such as "
        f"[('label', '<', 10)], got {type(filters).__name__} {filters!r:.80}"
    )


def _binds(expression: pc.Expression, schema: pa.Schema) -> bool:
    try:
        schema.empty_table().filter(expression)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return False
    return True


def _check_binds(expression: pc.Expression, schema: pa.Schema, names: list[str]) -> None:
    try:
        schema.empty_table().filter(expression)
    except pa.ArrowInvalid as error:
        if "No match for FieldRef" in str(error):
            leaves = [name for name in re.findall(r"FieldRef\.Name\(([^)]*)\)", str(error)) if name.split(".")[0] in names and "." in name]
            hint = f"; a struct's leaf is named by its path: pc.field({', '.join(map(repr, leaves[0].split('.')))})" if leaves else ""
            raise ValueError(f"filters={expression} names a column the files do not have; their columns are {names}{hint}") from error
        raise ValueError(f"filters={expression} cannot be applied to the data: {error}") from error
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError) as error:
        raise ValueError(f"filters={expression} does not fit the columns' types ({_types_named(expression, schema)}): {error}") from error


def _types_named(expression: pc.Expression, schema: pa.Schema) -> str:
    """The types of the columns whose names the expression's text mentions (all, if none is)."""
    text = str(expression)
    named = [field for field in schema if re.search(rf"(?<![\w.]){re.escape(field.name)}(?![\w])", text)] or list(schema)
    return ", ".join(f"{field.name}: {field.type}" for field in named)


def _referenced_columns(expression: pc.Expression, schema: pa.Schema) -> tuple[str, ...]:
    """The top-level columns ``expression`` reads (pyarrow does not list an expression's fields):
    the columns whose names its text mentions, then each one the expression still binds without
    is dropped. Falls back to every column when the names do not appear as written. (Binding is
    tried on those columns only: a column of a type pyarrow cannot filter a table of does not
    matter unless the filter reads it.)"""
    text = str(expression)
    needed = [name for name in schema.names if name in text]
    if not _binds(expression, pa.schema([schema.field(n) for n in needed])):
        needed = [field.name for field in schema if _binds(pc.scalar(True), pa.schema([field]))]  # tables pyarrow can filter
        unusable = [f"{name} ({schema.field(name).type})" for name in schema.names if name not in needed and name in text]
        if unusable:
            raise ValueError(f"filters={expression} reads {', '.join(unusable)}, which pyarrow cannot filter rows by; filter on other columns")
        _check_binds(expression, pa.schema([schema.field(n) for n in needed]), schema.names)  # raises, unless only the text misled
    for name in list(needed):
        rest = [n for n in needed if n != name]
        if _binds(expression, pa.schema([schema.field(n) for n in rest])):
            needed = rest
    return tuple(needed)


# ----------------------------------------------------------------- pruning by statistics
def _trusted(kind: pa.DataType) -> bool:
    """Types whose min/max statistics bound every value a comparison sees. Floats are left out:
    writers leave NaN out of their statistics, and ``not (x < 5)`` is true for NaN."""
    return (
        pa.types.is_integer(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_date(kind)
        or pa.types.is_timestamp(kind)
    )


class _ParquetFile:
    """A Parquet footer with its Arrow schema and column indices by name, made once per file."""

    def __init__(self, footer: pq.FileMetaData):
        self.footer = footer
        self.arrow = footer.schema.to_arrow_schema()
        self.leaf = {footer.schema.column(i).path: i for i in range(footer.num_columns)}
        # converted from the hybrid calendar as read (formats/_legacy_calendar.py): the statistics bound the stored values
        self.hybrid = spark_hybrid_columns(footer)


def _parquet_guarantee(file: _ParquetFile, unit: int, columns: Sequence[str], unified: pa.Schema, lacking: Sequence[str]) -> pc.Expression:
    """What every row of row group ``unit`` satisfies in ``columns``, from its statistics."""
    group, arrow, leaf = file.footer.row_group(unit), file.arrow, file.leaf
    terms = []
    for name in columns:
        field = pc.field(name)
        if name in lacking:
            terms.append(field.is_null())  # read as nulls in this file
            continue
        index = leaf.get(name)
        if index is None or arrow.get_field_index(name) < 0:
            continue
        stats = group.column(index).statistics
        if stats is None:
            continue
        nulls = stats.null_count if stats.has_null_count else None
        try:
            bounds = (stats.min, stats.max) if stats.has_min_max and (name,) not in file.hybrid else None
        except (OverflowError, ValueError):  # a bound Python cannot hold (a date before year 1): not known
            bounds = None
        term = column_term(name, bounds, arrow.field(name).type, unified.field(name).type, nulls, group.num_rows)
        if term is not None:
            terms.append(term)
    return _all(terms)


def column_term(name: str, bounds: tuple[Any, Any] | None, kind: pa.DataType, target: pa.DataType, nulls: int | None, rows: int) -> pc.Expression | None:
    """What every row satisfies in one column with values in ``bounds`` (of type ``kind``, read as
    ``target``) and ``nulls`` null values (None: unknown) of ``rows``; None: nothing known."""
    field = pc.field(name)
    if nulls is not None and nulls == rows:
        return field.is_null()
    if bounds is None or not (_trusted(kind) and _trusted(target)):
        return None
    try:
        low, high = (pa.scalar(value, type=kind).cast(target) for value in bounds)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None  # a value that does not convert: no guarantee from this column
    bounded = (field >= low) & (field <= high)
    return bounded if nulls == 0 else bounded | field.is_null()


def _orc_guarantee(stripe: dict[str, Any], schema: pa.Schema, columns: Sequence[str], unified: pa.Schema, lacking: Sequence[str], rows: int) -> pc.Expression:
    """What every row of an ORC stripe satisfies in ``columns``, from its statistics (see
    formats/_orc_tail.py: integers, dates, strings and booleans carry bounds)."""
    terms = []
    for name in columns:
        if name in lacking:
            terms.append(pc.field(name).is_null())
            continue
        stats = stripe.get(name)
        if stats is None or schema.get_field_index(name) < 0:
            continue
        nulls = None if stats.values is None or stats.has_null is None else rows - stats.values
        bounds = None if stats.minimum is None else (stats.minimum, stats.maximum)
        term = column_term(name, bounds, schema.field(name).type, unified.field(name).type, nulls, rows)
        if term is not None:
            terms.append(term)
    return _all(terms)


def _all(terms: list[pc.Expression]) -> pc.Expression:
    guarantee = pc.scalar(True)
    for term in terms:
        guarantee = guarantee & term
    return guarantee


def orc_statistics(fs: Any, files: Sequence[Any]) -> list[list[dict[str, Any]]]:
    """Per ORC file: each stripe's column statistics (read from its tail)."""

    def read(entry: Any) -> list[dict[str, Any]]:
        try:
            with open_input(fs, entry.fs_path) as source:
                tail = read_tail(source, entry.size)
                return read_stripe_statistics(source, entry.size, tail.column_ids, tail.hybrid_calendar)
        except (OSError, ValueError, IndexError, KeyError, TypeError) as error:  # no pruning in this file, still exact
            log.debug("no stripe statistics from %s: %s", entry.url, error)
            return []

    with ThreadPoolExecutor(max_workers=min(_STATISTICS_THREADS, max(1, len(files)))) as pool:
        return list(pool.map(read, files))


#: what statistics say of a unit: no row matches, some may, every row does
NONE, SOME, ALL = 0, 1, 2


def may_match(
    rows_filter: RowFilter,
    footers: Sequence[Any],
    unit_rows: Sequence[Sequence[int]],
    unified: pa.Schema,
    missing: Sequence[Sequence[str]],
    orc: Sequence[list[dict[str, Any]]] | None = None,
    directories: Sequence[pc.Expression | None] | None = None,
) -> list[list[int]]:
    """Per file, per unit: NONE where statistics rule out every row, ALL where they show every row
    matches (the filter's negation cannot hold: a null never satisfies a guarantee's bounds), else
    SOME. Parquet statistics come from ``footers``, ORC ones from ``orc`` (``orc_statistics``);
    ``directories``: per file, what its Hive partition values guarantee of every row (or None)."""
    unit_counts = [len(rows) for rows in unit_rows]
    guarantees_of: list[pc.Expression] = []
    where: list[tuple[int, int]] = []
    result = [[SOME] * count for count in unit_counts]
    for file, (footer, count) in enumerate(zip(footers, unit_counts)):
        lacking = missing[file] if missing else ()
        if isinstance(footer, pq.FileMetaData):
            parquet = _ParquetFile(footer)
            guarantees = [_parquet_guarantee(parquet, unit, rows_filter.columns, unified, lacking) for unit in range(count)]
        elif orc is not None and len(orc[file]) == count:  # (the unified schema stands for the file's: its types only widen)
            guarantees = [_orc_guarantee(orc[file][unit], unified, rows_filter.columns, unified, lacking, unit_rows[file][unit]) for unit in range(count)]
        else:
            guarantees = []
        directory = directories[file] if directories else None
        if directory is not None:
            guarantees = [directory & guarantee for guarantee in guarantees] if guarantees else [directory] * count
        if not guarantees:
            continue
        guarantees_of.extend(guarantees)
        where.extend((file, unit) for unit in range(count))
    for index, state in enumerate(classify(rows_filter, guarantees_of, unified)):
        file, unit = where[index]
        result[file][unit] = state
    return result


def classify(rows_filter: RowFilter, guarantees: Sequence[pc.Expression], unified: pa.Schema) -> list[int]:
    """NONE, SOME or ALL for each guarantee (what every row of some rows satisfies): whether the
    filter cannot hold, may hold, or must hold (its negation cannot) under it."""
    if not guarantees:
        return []
    # imported here: pyarrow.dataset imports pandas (40 MB of every process's memory) and only
    # filters= needs it
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    file_format = ds.ParquetFileFormat()
    nowhere = pafs.LocalFileSystem()
    # a fragment is only a holder of its guarantee here: nothing is opened at its path
    fragments = [file_format.make_fragment(f"unit/{index}", nowhere, partition_expression=g) for index, g in enumerate(guarantees)]
    dataset = ds.FileSystemDataset(fragments, unified, file_format, nowhere)
    try:
        some = {int(fragment.path.rsplit("/", 1)[1]) for fragment in dataset.get_fragments(filter=rows_filter.expression)}
        other = {int(fragment.path.rsplit("/", 1)[1]) for fragment in dataset.get_fragments(filter=~rows_filter.expression)}
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as error:  # e.g. a time zone against none
        types = _types_named(rows_filter.expression, unified)
        raise ValueError(f"filters={rows_filter.expression} does not fit the columns' types ({types}): {error}") from error
    return [NONE if index not in some else SOME if index in other else ALL for index in range(len(guarantees))]
