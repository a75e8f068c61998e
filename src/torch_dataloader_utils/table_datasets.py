"""IcebergDataset and DeltaDataset: a table snapshot's files read like plain files, with the snapshot
(Iceberg) or version (Delta) pinned in the state.

A state records the table and the snapshot its epoch read (``state/schema.py: TABLE``);
``load_state_dict`` plans that snapshot again, so a resumed epoch reads exactly what the
interrupted one would have, whatever the table received since. ``set_epoch`` to another epoch
reads the table's current snapshot, unless the dataset was created with a snapshot (time
travel) or ``pin_snapshot=True``. See docs/tables.md.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from typing import Any, Callable, Mapping, Sequence

from . import loaders
from .catalog.build import Catalog
from .catalog.filter_prune import filter_expression, filter_identity
from .dataset import StructuredDataset
from .errors import CheckpointMismatchError, UnknownColumnsError
from .options import integer
from .state.schema import FILTERS, TABLE
from .state.validate import mismatch, table_entry
from .storage.remote import IOOptions
from .tables import delta, iceberg
from .tables.plan import TablePlan, TableRef, table_catalog, with_row_filter

log = logging.getLogger(__name__)


class _TableDataset(StructuredDataset):
    """What Iceberg and Delta datasets share: planning a snapshot, and keeping it in the state."""

    _requested: int | None  # the snapshot asked for (None: the current one)
    _pinned: bool
    _filter_text: str | None = None  # the row filters, recorded by digest: a resume with others is refused

    _rows_source: Catalog | Callable[[], Catalog]  # what random access numbers: the snapshot without filters

    def _plan_table(self, snapshot: int | None, from_state: bool = False, schema_id: int | None = None) -> tuple[TablePlan, TablePlan]:
        """The snapshot's plan as read (deletes and filters applied) and as numbered (deletes only);
        ``snapshot`` None: the current one, with the table's current schema; ``schema_id``: the
        schema to read with (None: the snapshot's)."""
        raise NotImplementedError

    def _current_version(self) -> tuple[int, int | None]:
        """The table's current snapshot and schema (``TableRef.version``)."""
        raise NotImplementedError

    def _make_catalog(self, path: Any, format: str | None, storage_options: dict | None, split_bytes: int, io: IOOptions) -> Catalog:
        self._split_bytes, self._io = split_bytes, io
        plans = self._plan_table(self._requested)
        self._ref = plans[0].ref
        return self._catalogs(plans)

    def _catalogs(self, plans: tuple[TablePlan, TablePlan]) -> Catalog:
        """The catalog to read; the one to number rows in is kept for ``_rows_catalog``, built on first use."""
        read, numbered = plans
        catalog = table_catalog(read, self._split_bytes, self._io)
        self._rows_source = catalog if numbered is read else functools.partial(table_catalog, numbered, self._split_bytes, self._io)
        return catalog

    def _rows_catalog(self, catalog: Catalog) -> Catalog | Callable[[], Catalog]:
        return self._rows_source

    def _switch(self, plans: tuple[TablePlan, TablePlan]) -> None:
        """Read the plans' snapshot from now on."""
        before = self._rows_source
        try:
            self._use_catalog(self._catalogs(plans))
        except BaseException:
            self._rows_source = before
            raise
        self._ref = plans[0].ref

    @property
    def snapshot(self) -> int:
        """The snapshot id (Iceberg) or version (Delta) being read."""
        return self._ref.snapshot

    @property
    def table(self) -> dict:
        """The table and snapshot being read, as states record them."""
        return self._ref.to_dict()

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to read. Another epoch than the current one reads the table's current
        snapshot, unless the snapshot is pinned (``snapshot_id``/``version`` given, or ``pin_snapshot=True``)."""
        if not self._pinned and integer("epoch", epoch) != self.epoch:
            version = self._current_version()
            current = version[0]
            if version != self._ref.version:
                log.info("epoch %d reads %s (the epoch before read %s)", epoch, version, self._ref.version)
                if self.world_size > 1:
                    log.warning(
                        "rank %d: epoch %d reads the table's new snapshot %d; every rank must read the same one (a commit "
                        "between two ranks' set_epoch calls splits them): under DDP pin it (pin_snapshot=True or snapshot_id=; Delta: "
                        "pin_version=True or version=)",
                        self.rank, epoch, current,
                    )  # fmt: skip
                self._switch(self._plan_table(current, schema_id=version[1]))
        super().set_epoch(epoch)

    def _config(self, **topology: int) -> dict:
        config = super()._config(**topology)
        if self._filter_text is not None:  # applied at planning, so the catalog has no row filter of its own
            config[FILTERS] = hashlib.sha256(self._filter_text.encode()).hexdigest()[:16]
        return config

    def state_dict(self, form: str = "auto") -> dict:
        state = super().state_dict(form)
        state[TABLE] = self._ref.to_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any], elastic: bool = False) -> None:
        """Restore progress, planning the snapshot the state was taken on (see StructuredDataset.load_state_dict)."""
        self._with_state_snapshot(state, lambda: super(_TableDataset, self).load_state_dict(state, elastic), keep=True)

    def check_state_dict(self, state: Mapping[str, Any], elastic: bool = False) -> None:
        """Raise CheckpointMismatchError when ``load_state_dict(state, elastic)`` would refuse ``state``; change nothing."""
        self._with_state_snapshot(state, lambda: super(_TableDataset, self).check_state_dict(state, elastic), keep=False)

    def _with_state_snapshot(self, state: Mapping[str, Any], action: Any, keep: bool) -> None:
        entry = table_entry(state) if isinstance(state, Mapping) else None
        if entry is None or (entry["snapshot"], entry.get("schema_id")) == self._ref.version:
            if entry is not None:
                self._check_table(entry)
            action()
            return
        self._check_table(entry)
        if self._requested is not None and entry["snapshot"] != self._requested:  # the state's would replace it for every epoch
            saved = TableRef(entry["format"], entry["name"], entry["snapshot"], entry["uuid"])
            kind = "snapshot_id" if saved.format == "iceberg" else "version"
            raise mismatch(
                f"Checkpoint state was taken on {saved.describe()}, but this dataset reads {kind}={self._requested}.",
                [],
                [f"{kind} changed since the checkpoint"],
                f"Resume with {kind}={saved.snapshot} (or without {kind}, to go on to the table's current snapshot after "
                "the resumed epoch), or start the epoch again (set_epoch).",
            )
        before = (self._catalog, self._ref, self._rows_source)
        try:
            self._switch_to_saved(entry)
        except FileNotFoundError as error:  # the snapshot's log is there, but not all of its data files
            raise CheckpointMismatchError(
                f"Checkpoint state was taken on a snapshot whose data files are gone: {error}.\n\n  Start the epoch again "
                "from its beginning (set_epoch), or keep the files of snapshots until training jobs that read them end."
            ) from error
        except CheckpointMismatchError:
            raise
        except ValueError as error:  # e.g. columns= naming a column by a name given to it after the checkpoint
            saved = TableRef(entry["format"], entry["name"], entry["snapshot"], entry["uuid"])
            raise CheckpointMismatchError(
                f"Checkpoint state was taken on {saved.describe()}, which this dataset cannot read as it is set up: {error}.\n\n  "
                "If a column was renamed since, resume with the names that snapshot has (columns=, filters=) and take the new names "
                "in a dataset for the next epoch, or start the epoch again (set_epoch)."
            ) from error
        try:
            action()
        except BaseException:
            keep = False
            raise
        finally:
            if not keep:
                self._rows_source = before[2]
                self._use_catalog(before[0])
                self._ref = before[1]

    def _switch_to_saved(self, entry: Mapping[str, Any]) -> None:
        """Read the state's snapshot with the state's schema; if this dataset's columns are not in it
        (renamed since the checkpoint: the dataset names them as the table's schema does now), with
        this dataset's schema: columns are matched by field id, so the rows are the same."""
        try:
            self._switch(self._plan_table(entry["snapshot"], from_state=True, schema_id=entry.get("schema_id")))
        except UnknownColumnsError:
            own = self._ref.version[1]
            if own is None or own == entry.get("schema_id"):
                raise
            self._switch(self._plan_table(entry["snapshot"], from_state=True, schema_id=own))

    def _check_table(self, entry: Mapping[str, Any]) -> None:
        ref = self._ref
        if entry["format"] != ref.format or entry["name"] != ref.name or (entry["uuid"] or ref.uuid) and entry["uuid"] != ref.uuid:
            saved = TableRef(entry["format"], entry["name"], entry["snapshot"], entry["uuid"])
            raise mismatch(
                f"Checkpoint state was taken on another table: {saved.describe()} (uuid {saved.uuid}), not {ref.name!r} (uuid {ref.uuid}).",
                [],
                ["the dataset reads another table, or the table was dropped and created again"],
                "Resume with the table the checkpoint was taken on, or start the epoch again (set_epoch).",
            )


def _row_filter(filters: Any) -> Any:
    """A table's ``filters`` as an Expression: the DNF list form that StructuredDataset takes too."""
    return None if filters is None else filter_expression(filters)


class IcebergDataset(_TableDataset):
    """An Apache Iceberg table (through pyiceberg) as a stream of batches with exact resume.

    ``table``: "namespace.table"; ``catalog_config``: pyiceberg catalog properties, its "name"
    key naming the catalog; ``snapshot_id``: read that snapshot (time travel; pinned for every
    epoch), else the current one; ``scan_filter``: a pyiceberg expression or its text, used to
    prune files and to drop non-matching rows (counted at planning); ``filters``: a pyarrow
    expression over the table's columns (or pyarrow's DNF list form), rows it does not keep are
    dropped (counted at planning);
    ``pin_snapshot``: keep the first snapshot for every epoch. Other arguments as StructuredDataset.
    """

    def __init__(
        self,
        table: str,
        catalog_config: Mapping[str, Any] | None = None,
        *,
        snapshot_id: int | None = None,
        scan_filter: Any = None,
        filters: Any = None,
        pin_snapshot: bool = False,
        storage_options: dict | None = None,
        columns: Sequence[str] | None = None,
        **kwargs: Any,
    ):
        self._name = table
        self._catalog_config = dict(catalog_config or {})
        if isinstance(snapshot_id, str) and not snapshot_id.strip().lstrip("-").isdigit():
            raise TypeError(
                f"snapshot_id must be a snapshot's id (an integer), got {snapshot_id!r}. To read a branch or tag, pass its "
                f"snapshot: snapshot_id=table.refs()[{snapshot_id!r}].snapshot_id (pyiceberg), pinned for every epoch"
            )
        self._requested = None if snapshot_id is None else integer("snapshot_id", snapshot_id)
        self._pinned = bool(pin_snapshot) or snapshot_id is not None
        self._scan_filter, self._filters, self._columns = scan_filter, _row_filter(filters), columns
        if scan_filter is not None or filters is not None:
            filters_text = None if self._filters is None else filter_identity(self._filters)
            self._filter_text = f"scan_filter={scan_filter!r}; filters={filters_text}"
        self._storage_options = storage_options
        super().__init__(table, "parquet", columns=columns, storage_options=storage_options, **kwargs)

    @classmethod
    def create_dataloader(cls, table: str, catalog_config: Mapping[str, Any] | None = None, **kwargs: Any):  # type: ignore[override]
        """Build the dataset and its loader; returns ``(loader, dataset)`` (arguments: the class's and
        StructuredDataset.create_dataloader's)."""
        return super().create_dataloader(table, catalog_config, **kwargs)  # type: ignore[arg-type]

    def _load(self) -> Any:
        return iceberg.load_table(self._name, self._catalog_config)

    def _plan_table(self, snapshot: int | None, from_state: bool = False, schema_id: int | None = None) -> tuple[TablePlan, TablePlan]:
        table = self._load()
        found = iceberg.snapshot_of(table, self._name, snapshot, from_state)
        schema = iceberg.schema_of(table, self._name, found, table.schema().schema_id if snapshot is None else schema_id)
        options = self._storage_options if self._storage_options is not None else iceberg.storage_options_of(self._catalog_config, table)
        read = iceberg.plan_iceberg(table, self._name, found, schema, self._scan_filter, self._filters, self._columns, options)
        if self._scan_filter is None and self._filters is None:
            return read, read
        return read, iceberg.plan_iceberg(table, self._name, found, schema, None, None, self._columns, options)

    def _current_version(self) -> tuple[int, int | None]:
        table = self._load()
        return iceberg.snapshot_of(table, self._name, None).snapshot_id, table.schema().schema_id

    def _check_columns(self) -> None:
        try:
            super()._check_columns()
        except UnknownColumnsError as error:
            if self._requested is not None:  # time travel: the snapshot's own names
                raise
            raise UnknownColumnsError(
                f"{error} (the schema of the snapshot read). If a column was renamed, name it as the table does now: a "
                "checkpoint taken before the rename still resumes, its snapshot read by field id"
            ) from error


class DeltaDataset(_TableDataset):
    """A Delta Lake table (through deltalake) as a stream of batches with exact resume.

    ``path``: the table's directory or URI; ``version``: read that version (time travel; pinned for
    every epoch), else the latest; ``storage_options``: fsspec's options (s3fs key, secret and
    client_kwargs are passed on to deltalake); ``filters``: a pyarrow expression (or pyarrow's DNF
    list form), rows it does not keep are dropped (counted at planning); ``pin_version``: keep the first version for every epoch.
    Deletion vectors are applied. Other arguments as StructuredDataset.
    """

    def __init__(
        self,
        path: str,
        version: int | None = None,
        *,
        storage_options: dict | None = None,
        filters: Any = None,
        pin_version: bool = False,
        **kwargs: Any,
    ):
        self._uri = str(path)
        self._requested = None if version is None else integer("version", version)
        self._pinned = bool(pin_version) or version is not None
        self._filters = _row_filter(filters)
        self._filter_text = None if self._filters is None else filter_identity(self._filters)
        self._storage_options = storage_options
        super().__init__(path, "parquet", storage_options=storage_options, **kwargs)

    @classmethod
    def create_dataloader(cls, path: str, version: int | None = None, **kwargs: Any):  # type: ignore[override]
        """Build the dataset and its loader; returns ``(loader, dataset)`` (arguments: the class's and
        StructuredDataset.create_dataloader's)."""
        return super().create_dataloader(path, version, **kwargs)  # type: ignore[arg-type]

    def _plan_table(self, snapshot: int | None, from_state: bool = False, schema_id: int | None = None) -> tuple[TablePlan, TablePlan]:
        table = delta.open_delta(self._uri, snapshot, self._storage_options, from_state)  # a version has one schema
        numbered = delta.plan_delta(table, self._uri, self._storage_options)
        return with_row_filter(numbered, self._filters), numbered

    def _current_version(self) -> tuple[int, int | None]:
        return int(delta.open_delta(self._uri, None, self._storage_options).version()), None


for _table_class in (IcebergDataset, DeltaDataset):
    _table_class.create_dataloader.__func__.__signature__ = loaders.create_dataloader_signature(_table_class, StructuredDataset)  # type: ignore[union-attr]
