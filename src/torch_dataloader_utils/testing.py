"""Prove that a loader, or your wrapper around it, keeps the resume promise.

``assert_resumes_exactly(make)`` runs the uninterrupted run, then resumes from the state saved
after every batch in fresh loaders and checks that the rest is exactly what the uninterrupted
run delivered. See docs/testing.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch

__all__ = ["Reference", "assert_resumes_exactly", "fingerprint"]

_Make = Callable[[], "tuple[Iterable[Any], Any]"]
_Save = Callable[[Any, Any], dict]
_Load = Callable[[Any, Any, dict], None]

_PLAIN = (str, int, float, bool, type(None))


def fingerprint(value: Any) -> Any:
    """A deterministic, comparable value for a batch: tensors by dtype, shape and ``.tolist()``,
    Arrow record batches by schema and values, mappings by sorted key, lists and tuples as tuples, nested structures recursively, NaN as
    ``"nan"`` (so that equal batches compare equal)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), fingerprint(value.detach().cpu().tolist()))
    if isinstance(value, Mapping):  # dicts, and mappings such as a tokenizer's BatchEncoding (a UserDict)
        return tuple(sorted(((repr(k), fingerprint(v)) for k, v in value.items()), key=lambda kv: kv[0]))
    if isinstance(value, (list, tuple)):
        items = tuple(fingerprint(v) for v in value)
        return (type(value).__name__, items) if hasattr(value, "_fields") else items
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if not isinstance(value, (str, bytes)) and hasattr(value, "tolist"):  # numpy arrays and scalars
        return fingerprint(value.tolist())
    if hasattr(value, "to_pydict") and hasattr(value, "schema"):  # pyarrow record batches and tables
        return ("arrow", str(value.schema), fingerprint(value.to_pydict()))
    return value


def _merge_shape(value: Any, shape: dict[str, Any], path: str = "state") -> None:
    """Check 4: record the kind of every place in a state that holds a dict or a list (a dict with
    its sorted keys; list items merged into ``path[]``), values ignored. Raises AssertionError
    when a place already recorded, in this state or an earlier one, had another shape."""
    if isinstance(value, dict):
        kind: Any = ("dict", tuple(sorted(map(str, value))))
        children = [(f"{path}[{k!r}]", v) for k, v in value.items()]
    elif isinstance(value, list):
        kind, children = ("list",), [(f"{path}[]", v) for v in value]
    else:
        return
    before = shape.setdefault(path, kind)
    if before != kind:
        if before[0] == kind[0] == "dict":
            gained, lost = sorted(set(kind[1]) - set(before[1])), sorted(set(before[1]) - set(kind[1]))
            change = ", ".join(f"{word} the keys {keys}" for word, keys in (("gained", gained), ("lost", lost)) if keys)
        else:
            change = f"was a {before[0]}, is a {kind[0]}"
        raise AssertionError(f"the state's shape changed at {path}: it {change}")
    for child_path, child in children:
        _merge_shape(child, shape, child_path)


def _not_plain(value: Any, path: str = "state") -> str | None:
    """Where ``value`` holds something JSON would not give back as it is (tuples, numpy, ...)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if type(key) is not str:
                return f"{path} has the key {key!r} of type {type(key).__name__}, not str"
            found = _not_plain(item, f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(value, list):
        return next((f for i, item in enumerate(value) if (f := _not_plain(item, f"{path}[{i}]"))), None)
    if type(value) not in _PLAIN:
        return f"{path} is a {type(value).__module__}.{type(value).__qualname__} ({value!r:.80})"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{path} is {value}, which strict JSON cannot hold"
    return None


def _json_state(state: Any, where: str) -> dict:
    """Check 1: the state survives a JSON round trip unchanged; returns the round-tripped copy."""
    problem = _not_plain(state)
    if problem is None:
        try:
            copy = json.loads(json.dumps(state, allow_nan=False))
        except (TypeError, ValueError) as error:
            problem = f"json.dumps failed: {error}"
        else:
            if copy == state:
                return copy
            problem = "json.loads(json.dumps(state)) differs from the state"
    raise AssertionError(f"{where}: the state is not plain JSON: {problem}")


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + " ..."


@dataclass
class Reference:
    """The uninterrupted run: per epoch, every batch's key and the state saved after it."""

    batches: list[list[Any]] = field(default_factory=list)
    states: list[list[dict]] = field(default_factory=list)


def _default_save(loader: Any, dataset: Any) -> dict:
    return dataset.state_dict()


def _default_load(loader: Any, dataset: Any, state: dict) -> None:
    dataset.load_state_dict(state)


def assert_resumes_exactly(
    make: Callable[[], tuple[Iterable[Any], Any]],
    *,
    epochs: int = 2,
    points: Sequence[tuple[int, int]] | None = None,
    stride: int = 1,
    deep_stride: int = 4,
    batch_key: Callable[[Any], Any] = fingerprint,
    save: Callable[[Any, Any], dict] = _default_save,
    load: Callable[[Any, Any, dict], None] = _default_load,
    ignore_keys: Iterable[str] = (),
) -> Reference:
    """Check that every interruption point of ``make()``'s loader resumes exactly; see docs/testing.md.

    :param make: returns a fresh ``(loader, dataset)``; called once for the uninterrupted run and
        once or twice per point (it may return the same pair to test resumes in one live loader).
    :param epochs: epochs of the uninterrupted run (``dataset.set_epoch(e)`` before each).
    :param points: ``(epoch, batch_index)`` pairs: resume from the state saved after that batch
        (a negative index counts from the epoch's end, as in a list).
        ``None``: every ``stride``-th batch of every epoch, and its last.
    :param stride: with ``points=None``, resume after every ``stride``-th batch.
    :param deep_stride: checks 3, 5 and 6 run at every ``deep_stride``-th point and at the last
        point of each epoch; 1 runs them everywhere.
    :param batch_key: turns a batch into a comparable value (default: ``fingerprint``).
    :param save: ``save(loader, dataset)`` returns the state (default ``dataset.state_dict()``).
    :param load: ``load(loader, dataset, state)`` loads it (default ``dataset.load_state_dict``).
    :param ignore_keys: top-level keys left out of check 3 (state_dict right after loading).
    :returns: the uninterrupted run's batch keys and states, per epoch.
    :raises AssertionError: naming the point and the first batch that differs.
    """
    if epochs < 1 or stride < 1 or deep_stride < 1:
        raise ValueError("epochs, stride and deep_stride must be at least 1")
    reference = _reference(make, epochs, batch_key, save)
    selected = _select(reference, points, stride)
    last = {e: max(k for pe, k in selected if pe == e) for e in {pe for pe, _ in selected}}
    for index, (epoch, k) in enumerate(selected):
        deep = deep_stride == 1 or index % deep_stride == 0 or k == last[epoch]
        _check_point(make, reference, epoch, k, deep, batch_key, save, load, frozenset(ignore_keys))
    return reference


def _reference(make: _Make, epochs: int, batch_key: Callable[[Any], Any], save: _Save) -> Reference:
    """The uninterrupted run; checks 1 and 4 on every state it saves."""
    reference = Reference()
    loader, dataset = make()
    shape: dict[str, Any] = {}
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        reference.batches.append([])
        reference.states.append([])
        for batch in loader:
            reference.batches[-1].append(batch_key(batch))
            where = f"uninterrupted run, the state after batch {len(reference.states[-1])} of epoch {epoch}"
            state = _json_state(save(loader, dataset), where)
            try:
                _merge_shape(state, shape)
            except AssertionError as error:
                raise AssertionError(f"{where}: {error}") from None
            reference.states[-1].append(state)
    if not any(reference.batches):
        raise AssertionError("the uninterrupted run delivered no batch: there is no point to resume from")
    return reference


def _select(reference: Reference, points: Sequence[tuple[int, int]] | None, stride: int) -> list[tuple[int, int]]:
    if points is None:
        return [(e, k) for e, batches in enumerate(reference.batches) for k in sorted({*range(0, len(batches), stride), len(batches) - 1})]
    sizes = [len(batches) for batches in reference.batches]
    chosen = set()
    for epoch, k in points:
        if not (0 <= epoch < len(sizes) and -sizes[epoch] <= k < sizes[epoch]):
            raise ValueError(f"point ({epoch}, {k}) is outside the run: its epochs have {sizes} batches")
        chosen.add((epoch, k % sizes[epoch]))
    return sorted(chosen)


def _compare(got: list[Any], want: list[Any], what: str, offset: int) -> None:
    """The same batches, naming the first that differs (``offset``: the index of ``want[0]``)."""
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            number = f" (number {i + 1} after the resume)" if offset else ""
            raise AssertionError(f"{what}: batch {offset + i} differs{number}:\n"
                                 f"  got      {_short(a)}\n  expected {_short(b)}")
    if len(got) != len(want):
        extra = got[len(want)] if len(got) > len(want) else want[len(got)]
        kind = "an extra batch" if len(got) > len(want) else "fewer batches; the first missing one is"
        raise AssertionError(f"{what}: {len(got)} batches instead of {len(want)}, "
                             f"{kind} batch {offset + min(len(got), len(want))}: {_short(extra)}")


def _check_point(make: _Make, ref: Reference, epoch: int, k: int, deep: bool, batch_key: Callable[[Any], Any],
                 save: _Save, load: _Load, ignore: frozenset[str]) -> None:
    """Check 2 at one point; with ``deep`` also 3, 5 and 6."""
    name = f"resume from the state after batch {k} of epoch {epoch}"
    last = k == len(ref.batches[epoch]) - 1
    # at an epoch's last point there is no second resume to run check 3 on: run it here
    loader, dataset = _resume(make, ref.states[epoch][k], epoch, name, deep and last, save, load, ignore)
    rest, twice = [], None
    for batch in loader:
        rest.append(batch_key(batch))
        if deep and twice is None:
            twice = _json_state(save(loader, dataset), f"{name}: the state one batch later")
    _compare(rest, ref.batches[epoch][k + 1 :], name, k + 1)
    if not deep:
        return
    for later in range(epoch + 1, len(ref.batches)):  # check 5: the epochs after the resumed one
        dataset.set_epoch(later)
        _compare([batch_key(b) for b in loader], ref.batches[later], f"{name}, then epoch {later}", 0)
    if twice is not None:  # checks 6 and 3: resume again from the state saved one batch after this resume
        name = f"{name}, one batch, then a second resume"
        loader, dataset = _resume(make, twice, epoch, name, True, save, load, ignore)
        _compare([batch_key(b) for b in loader], ref.batches[epoch][k + 2 :], name, k + 2)


def _resume(make: _Make, state: dict, epoch: int, name: str, check_state: bool, save: _Save, load: _Load,
            ignore: frozenset[str]) -> tuple[Any, Any]:
    """A fresh ``make()`` that loads ``state`` (a JSON copy) and selects ``epoch``, as a training loop
    does; with ``check_state``, check 3 between the two: the state saved at once equals the loaded one."""
    loader, dataset = make()
    load(loader, dataset, json.loads(json.dumps(state)))
    if check_state:
        again = _json_state(save(loader, dataset), f"{name}: state_dict() right after loading")
        differs = sorted(key for key in set(state) | set(again) if key not in ignore and state.get(key) != again.get(key))
        if differs:
            shown = "; ".join(f"{key}: loaded {_short(state.get(key), 120)}, got {_short(again.get(key), 120)}" for key in differs[:3])
            raise AssertionError(f"{name}: state_dict() right after loading differs from the loaded state in {differs}: {shown}")
    restored = getattr(dataset, "epoch", epoch) if load is _default_load else epoch  # (a StatefulDataLoader loads later)
    if restored != epoch:
        raise AssertionError(f"{name}: dataset.epoch is {restored!r} after load_state_dict, but the state was saved in epoch {epoch}")
    dataset.set_epoch(epoch)
    return loader, dataset
