"""Delivering batches: the loader, passes and counting, moving chunks between processes, threads, a device feed."""
