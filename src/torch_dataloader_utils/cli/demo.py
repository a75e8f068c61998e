"""``tdu demo``: train, checkpoint, crash, resume, and check that every row was seen once."""

from __future__ import annotations

import argparse
import os

from ..errors import UsageError
from .output import EXIT_FAILED, EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo in ``--dir`` (new or empty) or a temporary directory; exit 1 unless exactly once."""
    from ..demo import run_demo

    if args.dir:
        if os.path.exists(args.dir) and not os.path.isdir(args.dir):
            raise UsageError(f"--dir {args.dir} is a file; give a new or empty directory")
        os.makedirs(args.dir, exist_ok=True)
        if os.listdir(args.dir):
            raise UsageError(f"--dir {args.dir} is not empty; give a new or empty directory")
    report = run_demo(args.dir, args.format, args.checkpoint_at)
    return EXIT_OK if report.ok else EXIT_FAILED
