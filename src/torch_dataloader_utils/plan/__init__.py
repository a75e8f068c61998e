"""Planning: pure functions and immutable values from file metadata and arguments (no I/O)."""
