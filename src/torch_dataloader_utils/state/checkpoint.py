"""Temporary re-exports while the CLI moves to state.schema / state.validate (removed at the end of the restructure)."""

from .schema import CONFIG_KEYS, FORMAT_VERSION, SHUFFLE_ONLY_KEYS  # noqa: F401
from .validate import is_count, is_integer, mismatch  # noqa: F401
