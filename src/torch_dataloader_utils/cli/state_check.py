"""Whether ``tdu inspect`` can read a state at all: its header, the shape of its keys and the
settings it records, checked by the library's own checks and reported as an input error naming
the state key (exit code 2) before anything is described or built from it."""

from __future__ import annotations

import re
from typing import Any

from ..errors import UsageError

MAX_WORKERS = 4096  # per rank: more is damage, not a job (a worker state has nothing else to compare it with)
_ADVICE = "The state was altered or not saved from dataset.state_dict(); use an intact copy of the checkpoint or discard it"


def check_state_fields(state: dict) -> None:
    """Raise UsageError naming the first key that ``describe_state`` cannot read, with what to do."""
    from ..errors import CheckpointMismatchError
    from ..state.shape import StateShapeError, check_state_shape
    from ..state.validate import check_header

    try:
        check_header(state)  # format_version and scope, as load_state_dict checks them first
    except CheckpointMismatchError as error:
        raise UsageError(" ".join(line.strip() for line in str(error).splitlines() if line.strip())) from None
    try:
        check_state_shape(state)
        _check_settings(state)
    except StateShapeError as error:
        raise UsageError(f"state key {error.key!r} is damaged: {error.detail}. {_ADVICE}") from None


def _check_settings(state: dict) -> None:
    """The recorded settings through the dataset's own argument checks (options.check_options),
    so that a value no dataset could be built with (equalize='foo', batch_size=0) is named here."""
    from ..options import DEFAULT_CHUNK_ROWS, DEFAULT_SHUFFLE_BUFFER_ROWS, check_options
    from ..plan.splits import DEFAULT_SPLIT_BYTES, MAX_SEED_WORD
    from ..state.schema import CHUNK_ROWS, CONFIG_KEYS
    from ..state.shape import StateShapeError

    settings: dict[str, Any] = dict(
        batch_size=1, num_workers=0, shuffle=False, shuffle_seed=0, split_bytes=DEFAULT_SPLIT_BYTES, rank=0, world_size=1, drop_last=False,
        equalize="pad", on_error="raise", shuffle_buffer_rows=DEFAULT_SHUFFLE_BUFFER_ROWS, split_rows=None, chunk_rows=DEFAULT_CHUNK_ROWS,
    )  # a setting the state leaves out is load_state_dict's to name
    settings.update({name: state[key] for key, name in CONFIG_KEYS.items() if key in state})
    if CHUNK_ROWS in state:
        settings["chunk_rows"] = state[CHUNK_ROWS]
    # a seed beyond 32 bits is refused with shuffling by today's versions, not damage: such a state is still described
    settings["shuffle_seed"] = min(settings["shuffle_seed"], MAX_SEED_WORD) if isinstance(settings["shuffle_seed"], int) else settings["shuffle_seed"]
    workers = settings["num_workers"]
    if isinstance(workers, int) and workers > MAX_WORKERS:  # inspect builds a plan with this many lanes
        raise StateShapeError("_num_workers", f"{workers} DataLoader workers per rank is past any real job's ({MAX_WORKERS} at most here)")
    try:
        check_options(columns=None, **settings)
    except (TypeError, ValueError) as error:
        name = re.match(r"\w+", str(error))
        key = name.group() if name else "?"
        raise StateShapeError(f"_{key}" if f"_{key}" in CONFIG_KEYS else key, str(error)) from None
