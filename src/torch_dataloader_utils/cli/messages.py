"""Library error messages as tdu prints them: one line, in tdu's option names."""

from __future__ import annotations

# The library's advice names Python arguments (format='orc', storage_options, on_error=...);
# tdu's users type options, and tdu has no on_error option at all.
_PYTHON_TO_OPTIONS = (
    ("format='parquet' or 'orc'", "--format parquet or --format orc"),
    ("format='parquet' or format='orc'", "--format parquet or --format orc"),
    ("format='parquet'", "--format parquet"),
    ("format='orc'", "--format orc"),
    ("(or format=None to infer it)", "(or no --format to infer it)"),
    ("storage_options", "--storage-option"),
    ("pass format= the one to read (format=None reads one format only)", "pass --format with the one to read (without --format, one format only is read)"),
    ("pass format= the one to read, or a path", "pass --format with the one to read, or a path"),
    ("pass format= one of", "pass --format, one of"),
    ("; pass None for all columns", "; leave out --columns for all columns"),
    (", or pass on_error='skip' to leave out rows that cannot be read", ""),
    ("Pass nulls='fill' (0 / False / NaN, or fill_values={column: value}) or nulls='mask' (also a '<column>.valid' bool tensor)",
     "Pass --nulls fill (0 / False / NaN) or --nulls mask (also a '<column>.valid' bool tensor)"),
    ("Pass nulls='fill' (fill_values={column: value} for other values than 0 / False / NaN) or nulls='mask' for a validity mask",
     "Pass --nulls fill (0 / False / NaN) or --nulls mask for a validity mask"),
    ("Pass nulls='fill' (or 'mask')", "Pass --nulls fill (or mask)"),
    ("out with columns=[...]", "out with --columns"),
)


def in_tdu_options(message: str) -> str:
    """A library error message with its advice in tdu's options instead of Python arguments.

    Why string replacement: the library's messages are written for Python callers and
    the CLI shows the same errors; ``_PYTHON_TO_OPTIONS`` lists every phrase that has a
    tdu spelling. A phrase the library rewords is no longer replaced, and tests/test_cli.py
    (test_errors_give_advice_in_tdu_options and the damaged-file bench test) catches that.
    """
    for python, option in _PYTHON_TO_OPTIONS:
        message = message.replace(python, option)
    return message


def without_worker_traceback(error: BaseException) -> str:
    """The error's message; for an error torch re-raised from a DataLoader worker ("Caught X in
    DataLoader worker process N. Original Traceback ..."), the worker's error without its traceback."""
    message = str(error)
    if "\nOriginal Traceback (most recent call last):\n" not in message:
        return message
    name = type(error).__qualname__
    names = (f"{type(error).__module__}.{name}: ", f"{name}: ")
    lines = message.splitlines()
    last = max((i for i, line in enumerate(lines) if line.startswith(names)), default=None)
    if last is None:
        return message
    first_line = lines[last]
    prefix = next(p for p in names if first_line.startswith(p))
    return "\n".join([first_line[len(prefix) :], *lines[last + 1 :]]).strip()
