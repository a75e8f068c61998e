"""Applying a row filter to decoded rows: by pyarrow's compute kernels directly when it was given
in the DNF list form, else by pyarrow's expression engine.

``Table.filter(expression)`` binds the expression and runs it as a small query plan on every call,
which costs about as much as decoding a column of a row group. A filter given as
``[(column, op, value), ...]`` (or a list of such lists) is evaluated here instead as the
expression ``pyarrow.parquet.filters_to_expression`` makes of it would be: ``=``/``==``, ``!=``,
``<``, ``>``, ``<=``, ``>=`` by their comparison kernels, ``in`` by ``is_in`` and ``not in`` by its
inversion, joined by Kleene ``and`` / ``or``; a row whose result is null is left out, as
``filter`` leaves it out. The counts at planning and the readers use the same function, so they
agree row for row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    from ..formats._lazy import compute as pc  # imported when first used

_COMPARE = {"=": "equal", "==": "equal", "!=": "not_equal", "<": "less", ">": "greater", "<=": "less_equal", ">=": "greater_equal"}
_SETS = ("in", "not in")  # (every op here is one filter_prune.DNF_OPERATORS names)


def matching_count(rows_filter: Any, table: pa.Table) -> int:
    """The rows of ``table`` that ``rows_filter`` keeps."""
    mask = _direct_mask(rows_filter, table)
    if mask is None:
        return int(table.filter(rows_filter.expression).num_rows)
    return int(pc.sum(mask).as_py() or 0)


def matching_rows(rows_filter: Any, table: pa.Table) -> pa.Table:
    """The rows of ``table`` that ``rows_filter`` keeps, in their order."""
    mask = _direct_mask(rows_filter, table)
    return table.filter(rows_filter.expression) if mask is None else table.filter(mask)


def _direct_mask(rows_filter: Any, table: pa.Table) -> Any:
    """The filter's mask by the kernels, or None: not in the DNF form, or a value the kernels take
    otherwise than the expression would (pyarrow's expression engine then decides, and raises)."""
    if rows_filter.dnf is None:
        return None
    try:
        return _mask(rows_filter.dnf, table)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowInvalid, TypeError, ValueError):
        return None


def _mask(dnf: tuple, table: pa.Table) -> Any:
    either = None
    for conjunction in dnf:
        every = None
        for column, op, value in conjunction:
            values = table.column(column)
            if op in _SETS:
                test = pc.is_in(values, value_set=pa.array(value))
                test = pc.invert(test) if op == "not in" else test
            else:
                test = getattr(pc, _COMPARE[op])(values, value)
            every = test if every is None else pc.and_kleene(every, test)
        either = every if either is None else pc.or_kleene(either, every)
    return either
