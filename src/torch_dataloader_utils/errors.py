"""Public exceptions."""

from __future__ import annotations


class CheckpointMismatchError(ValueError):
    """A saved dataset state cannot be resumed exactly against the current plan.

    Raised by ``load_state_dict`` when the checkpoint was taken with a different
    configuration (num_workers, shuffle_seed, world size, rank, split_bytes, ...)
    or a different file list, or when the state itself is damaged. The message
    names the checkpoint shard or state key, the likely cause with both values,
    and what to do.
    """


class DataReadError(OSError):
    """A data file could not be read; the message names the file and split."""


class FileChangedError(OSError):
    """A file is no longer the version that was planned (its size, tag or row counts changed).
    Raised while reading, it reaches the user inside a DataReadError."""


class RemoteReadError(OSError):
    """A read from an object store that failed for good: a permanent fault, or a transient one that
    outlasted ``download_retry`` retries. The message names the file and what the store answered.
    Raised while reading, it reaches the user inside a DataReadError naming the split."""


class WideningError(ValueError):
    """A value of one file does not fit the type its column is read as in all files (see the
    schema rule in docs/reliability.md). Raised while reading, it reaches the user inside a
    DataReadError naming the file."""


class UnsupportedFileError(ValueError):
    """A complete data file that this package cannot read (an encrypted Parquet file, a footer
    pyarrow refuses); the message says why. Planning raises it naming the file."""


class UnknownColumnsError(ValueError):
    """``columns=`` names columns the data (the schema planned) does not have; the message lists
    those it has."""


class UsageError(Exception):
    """Bad input from the user: printed without a traceback, exit code 2."""


class TransformError(RuntimeError):
    """The ``transform`` passed to the dataset raised; the message names the batch (its lane rows,
    files and splits) and the error, which is chained as the cause where it ran in this process."""
