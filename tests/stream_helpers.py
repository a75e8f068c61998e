"""A stream expanded row by row: the reference the stream, lane and state tests compare with."""

from torch_dataloader_utils.plan.streams import Stream


def rows_in_order(stream: Stream) -> list[tuple[int, int, int, int]]:
    """(split, file, unit, row in unit) of every stream row in delivery order, expanded one by one."""
    rows = []
    for window in range(stream.num_windows):
        pieces = stream.pieces[int(stream.window_pieces[window]) : int(stream.window_pieces[window + 1])]
        inside = [(p.split, p.file, p.unit, r) for p in pieces for r in range(p.start, p.stop)]
        permutation = stream.window_permutation(window)
        rows += [inside[i] for i in permutation] if permutation is not None else inside
    return rows
