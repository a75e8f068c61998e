"""The ``tdu`` command line (also ``python -m torch_dataloader_utils``).

Commands: ``plan`` (how a path is cut into splits and dealt to ranks and workers), ``rows``
(print rows by global row number), ``inspect`` (explain a saved dataset state, and check it against the data), ``bench``
(this loader's throughput on your data) and ``demo`` (train, crash, resume, check every
row was seen once); one module each. ``parser`` declares the options, ``options`` their
value types, ``output`` the exit codes and printing, ``messages`` how library errors read
in tdu's terms, ``state_file`` how states are found in a checkpoint file.

Exit codes: 0 success; 1 the check ran and failed (demo not exactly-once, the
state does not fit the data); 2 usage or input error (bad arguments, missing
files, not a dataset state, a damaged state); with ``-v`` also the error's traceback.

Commands import torch, pyarrow and the dataset inside their functions, so that
``tdu --help`` starts without them.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Sequence

from ..errors import UsageError
from .messages import in_tdu_options, without_worker_traceback
from .output import EXIT_OK, EXIT_USAGE
from .parser import build_parser, parse_args

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``tdu`` and ``python -m torch_dataloader_utils``."""
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="tdu: %(levelname)s: %(name)s: %(message)s")
    try:
        return args.run(args)
    except BrokenPipeError:  # output piped into head & co.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - left open: Python flushes stdout at exit, not into the closed pipe
        return EXIT_OK
    except UsageError as error:
        print(f"tdu {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (FileNotFoundError, ValueError, OSError, ImportError) as error:
        if args.verbose:  # the traceback for a bug report, and still the error line and exit code of an input error
            traceback.print_exc()
        print(f"tdu {args.command}: error: {in_tdu_options(without_worker_traceback(error))}", file=sys.stderr)
        return EXIT_USAGE
