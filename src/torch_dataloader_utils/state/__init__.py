"""The checkpoint state: its schema, live progress, validation, restoring, merging ranks, elastic re-dealing."""
