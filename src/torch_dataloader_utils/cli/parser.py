"""Which commands and options ``tdu`` has, and the checks argparse cannot express."""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence

from ..formats import ALIASES, FORMATS
from ..plan.epoch import EQUALIZE_POLICIES
from ..plan.splits import MAX_SEED_WORD
from .bench import cmd_bench
from .demo import cmd_demo
from .inspect import cmd_inspect
from .options import int_at_least, non_negative_int, one_per_path, parse_filters, parse_size, positive_int, storage_option
from .plan import cmd_plan
from .rows import cmd_rows, parse_rows


def _add_data_options(parser: argparse.ArgumentParser, split_bytes: bool = True, filters: bool = True) -> None:
    parser.add_argument("--format", choices=[*FORMATS, *ALIASES], default=None,
                        help="file format (default: inferred from the file extensions)")
    if filters:
        parser.add_argument("--filters", type=parse_filters, default=None, metavar="FILTER",
                            help="only the rows that match, as filters= (e.g. 'label < 10 and name = abc', "
                                 "or DNF JSON '[[[\"a\", \"=\", 1]], [[\"b\", \"in\", [2, 3]]]]')")
    if split_bytes:
        parser.add_argument("--split-bytes", type=parse_size, default=128 * 1024 * 1024, metavar="SIZE",
                            help="largest split, compressed (e.g. 64MiB; default 128MiB)")
    parser.add_argument("--storage-option", type=storage_option, action="append", metavar="KEY=VALUE",
                        help="fsspec storage option for remote paths, repeatable (e.g. anon=true, "
                             'client_kwargs=\'{"endpoint_url": "http://localhost:9000"}\')')


def build_parser() -> argparse.ArgumentParser:
    """The ``tdu`` parser; each command sets ``run`` to its ``cmd_*`` function."""
    parser = argparse.ArgumentParser(
        prog="tdu",
        description="torch_dataloader_utils: exactly-once, resumable PyTorch loading of Parquet, ORC, CSV, JSON Lines and Arrow IPC files.",
        epilog="Exit codes: 0 success; 1 the check failed (demo, inspect with PATH); 2 usage or input error.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help="log more (-v info, -vv debug)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    plan = commands.add_parser("plan", parents=[common], help="show how PATH is cut into splits and dealt to ranks and workers",
                               description="Read the footers of PATH and show files, splits, rows and bytes, "
                                           "and the balance across ranks and workers.")
    plan.add_argument("path", nargs="+", metavar="PATH", help="file, directory, glob or URL (several allowed)")
    plan.add_argument("--world-size", type=positive_int, default=1, metavar="N", help="number of ranks (default 1)")
    plan.add_argument("--num-workers", type=non_negative_int, default=2, metavar="W", help="DataLoader workers per rank (default 2)")
    plan.add_argument("--batch-size", type=positive_int, default=1024, metavar="N", help="for the batch counts (default 1024)")
    plan.add_argument("--shuffle", action="store_true", help="plan a shuffled epoch")
    plan.add_argument("--shuffle-seed", type=int_at_least(0, MAX_SEED_WORD), default=0, metavar="S")
    plan.add_argument("--epoch", type=int_at_least(0, MAX_SEED_WORD), default=0, metavar="E", help="epoch to show (matters with --shuffle)")
    plan.add_argument("--equalize", choices=EQUALIZE_POLICIES, default="pad",
                      help="how ranks get equal batch counts under DDP (default pad)")
    plan.add_argument("--rows-per-epoch", type=one_per_path(positive_int, "--rows-per-epoch"), nargs="+", default=[], metavar="N",
                      help="plan a mixture: rows each PATH (a source) contributes per epoch, one per PATH")
    plan.add_argument("--weight", type=one_per_path(float, "--weight"), nargs="+", default=[], metavar="W", help="plan a mixture: a weight per PATH")
    plan.add_argument("--epoch-rows", type=positive_int, default=None, metavar="N", help="rows per epoch the weights share")
    plan.add_argument("--shuffle-buffer-rows", type=positive_int, default=1 << 18, metavar="N", help="a mixture's window rows")
    plan.add_argument("--columns", help="a mixture's columns, comma-separated (default: all; sources that lack some need it)")
    plan.add_argument("--all", action="store_true", help="list every (rank, worker), however many")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    _add_data_options(plan)
    plan.set_defaults(run=cmd_plan)

    inspect = commands.add_parser("inspect", parents=[common], help="explain a saved dataset state; with PATH, check it against the data",
                                  description="Explain a dataset state saved from dataset.state_dict(): a JSON file, "
                                              "or a torch checkpoint that holds it (found automatically, or named with --key). "
                                              "With PATH, build a dataset with the state's topology and report whether "
                                              "load_state_dict accepts it, and why not.")
    inspect.add_argument("state", metavar="STATE", help="JSON file or torch checkpoint")
    inspect.add_argument("path", nargs="*", metavar="PATH", help="the data the state should resume on")
    inspect.add_argument("--key", help="where the state sits in the checkpoint, dotted (e.g. dataset, dataset_states.1)")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.add_argument("--splits", action="store_true", help="with PATH: list every completed split by content (also of a compact state)")
    _add_data_options(inspect, split_bytes=False)
    inspect.set_defaults(run=cmd_inspect)

    bench = commands.add_parser("bench", parents=[common], help="measure this loader's throughput on your data",
                                description="Iterate PATH with create_dataloader for one epoch (or --seconds), "
                                            "report rows/s and start-up time, and time a resume from the middle.")
    bench.add_argument("path", nargs="+", metavar="PATH")
    bench.add_argument("--batch-size", type=positive_int, default=1024, metavar="N")
    bench.add_argument("--num-workers", type=non_negative_int, default=2, metavar="W")
    bench.add_argument("--shuffle", action="store_true")
    bench.add_argument("--shuffle-seed", type=int_at_least(0, MAX_SEED_WORD), default=0, metavar="S")
    bench.add_argument("--columns", help="comma-separated columns to read (default: all)")
    bench.add_argument("--chunk-rows", type=positive_int, default=None, metavar="N", help="rows per worker read (default 32768)")
    bench.add_argument("--seconds", type=float, default=30.0, metavar="S", help="time budget (default 30)")
    bench.add_argument("--max-batches", type=positive_int, default=None, metavar="N", help="stop after N batches")
    bench.add_argument("--no-resume", action="store_true", help="skip the resume measurement")
    bench.add_argument("--nulls", choices=("raise", "fill", "mask"), default="raise",
                       help="nulls in number columns: raise (the default, as create_dataloader), fill with 0, or mask (a COLUMN.valid mask per column)")
    bench.add_argument("--json", action="store_true", help="machine-readable output")
    _add_data_options(bench)
    bench.set_defaults(run=cmd_bench)

    rows = commands.add_parser("rows", parents=[common], help="print rows by global row number (dataset[i]) and where they come from",
                               description="Print rows of PATH by their global row number: rows of all files in file order, "
                                           "in stored order within a file (StructuredDataset's dataset[i]).")
    rows.add_argument("path", nargs="+", metavar="PATH", help="file, directory, glob or URL (several allowed)")
    rows.add_argument("rows", type=parse_rows, metavar="ROWS", help="a row (1000, -1), a range (1000:1010, ::100) or a list (3,17,42)")
    rows.add_argument("--columns", help="comma-separated columns to show (default: all)")
    rows.add_argument("--width", type=non_negative_int, default=80, metavar="N", help="cut longer text to N characters (0: never; default 80)")
    rows.add_argument("--limit", type=positive_int, default=1000, metavar="N", help="refuse a range of more rows (default 1000)")
    rows.add_argument("--json", action="store_true", help="machine-readable output (text never cut)")
    _add_data_options(rows, split_bytes=False, filters=False)
    rows.set_defaults(run=cmd_rows)

    demo = commands.add_parser("demo", parents=[common], help="train, checkpoint, crash, resume, and check every row was seen once",
                               description="Write a small dataset, train a tiny model with 2 workers, checkpoint, "
                                           "kill the training process, resume in a new one, and check that every row "
                                           "was seen exactly once. Exit code 1 if not.")
    demo.add_argument("--format", choices=["parquet", "orc"], default="parquet")
    demo.add_argument("--dir", help="keep the data and checkpoint here (default: a temporary directory)")
    demo.add_argument("--checkpoint-at", type=float, default=0.45, metavar="F",
                      help="checkpoint after this fraction of the epoch (default 0.45)")
    demo.set_defaults(run=cmd_demo)
    for command in commands.choices.values():
        command.set_defaults(command_parser=command)  # its errors show its own usage line
    return parser


# a range or list of rows that starts with a negative row ("-5:-3", "-3:", "-1,-2")
_NEGATIVE_ROWS = re.compile(r"-\d*:[-\d:]*|-\d+(,-?\d+)+,?")


def _rows_kept_positional(argv: Sequence[str]) -> list[str]:
    """``tdu rows PATH -5:-3``: argparse reads a token that starts with '-' as an option unless it
    is a plain negative number or holds a space, so such a row range is given a leading space
    (which ``parse_rows`` ignores)."""
    argv = list(argv)
    if "rows" not in argv or any(token != "rows" and not token.startswith("-") for token in argv[: argv.index("rows")]):
        return argv
    end = argv.index("--") if "--" in argv else len(argv)
    return [f" {token}" if index < end and _NEGATIVE_ROWS.fullmatch(token) else token for index, token in enumerate(argv)]


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, where inspect's PATH may also follow its options; exits 2 on a bad value."""
    args, extra = parser.parse_known_args(_rows_kept_positional(sys.argv[1:] if argv is None else argv))
    command_parser = getattr(args, "command_parser", parser)
    if extra and args.command == "inspect" and not any(e.startswith("-") for e in extra):
        args.path += extra  # PATH given after options: argparse leaves it over
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "demo" and not 0 < args.checkpoint_at < 1:
        command_parser.error("--checkpoint-at must be a fraction strictly between 0 and 1 (e.g. 0.4)")
    if args.command == "bench" and not (math.isfinite(args.seconds) and args.seconds > 0):
        command_parser.error(f"--seconds must be a positive number of seconds, got {args.seconds}")
    return args
