"""Running ``tdu`` in the test's process."""

from __future__ import annotations

from torch_dataloader_utils.cli import main


def run(capsys, *argv) -> tuple[int, str, str]:
    """``tdu ARGV...``: its exit code, standard output and standard error."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err
