"""KeyboardInterrupts raised at counted places in the loader's code, the same on every machine."""

from __future__ import annotations

import os
import sys
from typing import Callable

import torch.utils.data

import torch_dataloader_utils


def interrupted_at(action: Callable[[], object], point: int) -> bool:
    """Run ``action()`` and raise KeyboardInterrupt at the ``point``-th place in it where CPython
    could run a Ctrl-C's handler inside the loader's own code or torch's data utilities: a
    function's entry, or just after it called a C function (CPython handles signals there and at
    loops' backward jumps, not between any two bytecodes). True if it struck before the action
    ended. Counted places, not a timer: every machine interrupts at the same ones. Only the calling
    process is interrupted."""
    watched = (os.path.dirname(torch_dataloader_utils.__file__), os.path.dirname(torch.utils.data.__file__))
    reached = [0]
    parent = os.getpid()

    def profile(frame, event, arg):
        if os.getpid() != parent:  # a worker forked while the action ran inherits this function
            sys.setprofile(None)
        elif event in ("call", "c_return") and frame.f_code.co_filename.startswith(watched):
            reached[0] += 1
            if reached[0] == point:
                raise KeyboardInterrupt  # raised by the profile function: it propagates into the frame

    sys.setprofile(profile)
    try:
        action()
        return False
    except KeyboardInterrupt:
        return True
    finally:
        sys.setprofile(None)
