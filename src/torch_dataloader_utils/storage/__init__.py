"""The fsspec side: local vs remote files, ranged reads, retries, the disk cache, file versions (no pyarrow)."""
