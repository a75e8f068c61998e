import os
import subprocess
import sys

import pytest
from datagen import write_dataset
from servers import s3, store_registry  # noqa: F401 - fixtures

from torch_dataloader_utils import StructuredDataset


@pytest.fixture()
def tree(tmp_path):
    write_dataset(tmp_path / "a", [[5], [5]])
    write_dataset(tmp_path / "a" / "nested", [[5]], first_id=10)
    for marker in ("_SUCCESS", "_metadata", "_common_metadata", ".part-00000.parquet.crc", "part-00000.parquet.crc"):
        (tmp_path / "a" / marker).write_bytes(b"x")
    os.makedirs(tmp_path / "a" / "_temporary")
    (tmp_path / "a" / "_temporary" / "junk.parquet").write_bytes(b"junk")
    (tmp_path / "a" / ".hidden.parquet").write_bytes(b"junk")
    return tmp_path


def test_directory_is_recursive_sorted_and_skips_markers(tree):
    dataset = StructuredDataset(str(tree / "a"), num_workers=0)
    names = [os.path.relpath(f, tree / "a") for f in dataset.files]
    assert names == ["nested/part-00000.parquet", "part-00000.parquet", "part-00001.parquet"]
    assert len(dataset) == 15


def test_glob_list_and_single_file(tree):
    by_glob = StructuredDataset(str(tree / "a" / "part-*.parquet"), num_workers=0)
    assert len(by_glob.files) == 2
    one = str(tree / "a" / "part-00001.parquet")
    both = StructuredDataset([one, str(tree / "a" / "nested")], num_workers=0)
    assert both.files == sorted([one, str(tree / "a" / "nested" / "part-00000.parquet")])
    assert StructuredDataset(one, num_workers=0).files == [one]


def test_format_inferred_from_extension(tmp_path):
    write_dataset(tmp_path / "o", [[4, 4]], fmt="orc")
    dataset = StructuredDataset(str(tmp_path / "o"), format=None, num_workers=0)
    assert len(dataset) == 8


def test_mixed_formats_need_an_explicit_format(tmp_path):
    write_dataset(tmp_path / "m", [[4]], fmt="orc")
    write_dataset(tmp_path / "m" / "p", [[4]])
    with pytest.raises(ValueError, match=r"several formats \['orc', 'parquet'\] found \(1 orc file\(s\), such as '.*m/part-00000\.orc'; 1 parquet"):
        StructuredDataset(str(tmp_path / "m"), format=None, num_workers=0)
    (tmp_path / "m" / "state.json").write_text('{"x": 1}\n')
    with pytest.raises(FileNotFoundError, match=r"files of parquet, orc, jsonl are there: pass format= the one to read \(format=None reads one format only\)"):
        StructuredDataset(str(tmp_path / "m"), format="csv", num_workers=0)
    assert len(StructuredDataset(str(tmp_path / "m"), format="orc", num_workers=0)) == 4


def test_missing_path_and_empty_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        StructuredDataset(str(tmp_path / "nope"), num_workers=0)
    os.makedirs(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no parquet files found"):
        StructuredDataset(str(tmp_path / "empty"), num_workers=0)


@pytest.mark.parametrize("fmt, other", [("parquet", "orc"), ("orc", "parquet")])
def test_a_directory_of_the_other_format_is_named_in_the_error(tmp_path, fmt, other):
    write_dataset(tmp_path / "d", [[4]], other)
    with pytest.raises(FileNotFoundError, match=rf"no {fmt} files found under .*; {other} files are there: to read those, pass format='{other}'"):
        StructuredDataset(str(tmp_path / "d"), format=fmt, num_workers=0)


@pytest.mark.parametrize("fmt, other", [("parquet", "orc"), ("orc", "parquet")])
def test_a_file_of_the_other_format_named_by_path_gets_the_format_to_pass(tmp_path, fmt, other):
    write_dataset(tmp_path / "d", [[4]], other)
    (path,) = [str(p) for p in (tmp_path / "d").iterdir() if p.name.endswith("." + other)]
    with pytest.raises(ValueError, match=rf"cannot read the {fmt} footer of .*\.{other}: .* Its name says {other}: pass format='{other}'"):
        StructuredDataset(path, format=fmt, num_workers=0)


def test_garbage_file_names_the_file(tmp_path):
    write_dataset(tmp_path / "g", [[4]])
    (tmp_path / "g" / "part-zzz.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match=r"cannot read the parquet footer of .*part-zzz.parquet"):
        StructuredDataset(str(tmp_path / "g"), num_workers=0)


def test_unknown_format_and_unknown_column_are_usage_errors(tmp_path):
    write_dataset(tmp_path / "u", [[4]])
    with pytest.raises(ValueError, match="format must be 'parquet' or 'orc'"):
        StructuredDataset(str(tmp_path / "u"), format="avro", num_workers=0)
    with pytest.raises(ValueError, match=r"columns \['nope'\] are not in the data; its columns are \['id'"):
        StructuredDataset(str(tmp_path / "u"), columns=["id", "nope"], num_workers=0)


def test_null_error_names_the_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(tmp_path / "n")
    pq.write_table(pa.table({"id": [1, None, 3]}), tmp_path / "n" / "a.parquet", write_statistics=False)  # no null counts: found as rows are read
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path / "n"), num_workers=0)
    with pytest.raises(ValueError, match=r"column 'id' has 1 null value\(s\) in rows read from .*a.parquet"):
        list(loader)


def hive_orc_table(root):
    """A Hive-style ORC table: data files without extension, next to markers and a stray Parquet file."""
    write_dataset(root, [[4], [3]], fmt="orc")
    os.rename(root / "part-00000.orc", root / "000000_0")
    os.rename(root / "part-00001.orc", root / "000001_0")
    write_dataset(root / "other", [[2]])  # another format's extension: never taken for ORC
    (root / "_SUCCESS").write_bytes(b"")
    (root / ".000000_0.crc").write_bytes(b"x")
    (root / "000000_0.crc").write_bytes(b"x")
    (root / "README.md").write_bytes(b"# not data")
    os.makedirs(root / "_temporary" / "0")
    (root / "_temporary" / "0" / "000002_0").write_bytes(b"junk")
    return root


def test_files_without_extension_are_read_through_the_glob_the_error_suggests(tmp_path):
    root = hive_orc_table(tmp_path / "t")
    assert StructuredDataset(str(root), num_workers=0).files == [str(root / "other" / "part-00000.parquet")]
    with pytest.raises(FileNotFoundError, match=r"no orc files found .*a directory keeps \*\.orc files.*Hive's 000000_0.*pass a glob that matches them"):
        StructuredDataset(str(root), format="orc", num_workers=0)
    dataset = StructuredDataset(str(root / "*_0"), format="orc", num_workers=0)
    assert dataset.files == [str(root / "000000_0"), str(root / "000001_0")]
    assert len(dataset) == 7


def test_mixed_filesystems_are_refused_before_listing(tmp_path):
    write_dataset(tmp_path / "d", [[4]])
    local = str(tmp_path / "d" / "part-00000.parquet")
    with pytest.raises(ValueError, match=r"path 's3://bucket/x.parquet' is on a different filesystem .*one filesystem"):
        StructuredDataset([local, "s3://bucket/x.parquet"], num_workers=0)
    assert len(StructuredDataset([local, "file://" + local], num_workers=0)) == 4


def test_glob_skips_ignored_directories_below_its_prefix(tmp_path):
    root = tmp_path / "_staging" / "data"  # an ignored-looking name above the glob is fine
    write_dataset(root / "day=1", [[4]])
    write_dataset(root / "_temporary" / "0", [[5]])
    write_dataset(root / ".trash", [[6]])
    by_recursive_glob = StructuredDataset(str(root / "**" / "*.parquet"), num_workers=0)
    assert by_recursive_glob.files == [str(root / "day=1" / "part-00000.parquet")]
    by_directory_glob = StructuredDataset(str(root / "*"), num_workers=0)
    assert by_directory_glob.files == [str(root / "day=1" / "part-00000.parquet")]


def test_bytes_paths_are_decoded(tmp_path):
    write_dataset(tmp_path / "b", [[4]])
    expected = [str(tmp_path / "b" / "part-00000.parquet")]
    assert StructuredDataset(os.fsencode(tmp_path / "b"), num_workers=0).files == expected
    assert StructuredDataset([os.fsencode(expected[0])], num_workers=0).files == expected


def test_a_file_name_that_is_not_utf8_is_named_as_the_problem(tmp_path):
    write_dataset(tmp_path / "n", [[4]])
    os.rename(tmp_path / "n" / "part-00000.parquet", os.path.join(os.fsencode(tmp_path / "n"), b"part-\xff.parquet"))
    with pytest.raises(ValueError, match=r"cannot open '.*part-\\udcff.parquet': its name is not valid UTF-8") as error:
        StructuredDataset(str(tmp_path / "n"), num_workers=0)
    assert "complete parquet file" not in str(error.value)


def test_a_missing_cloud_client_names_the_extra_to_install():
    code = (
        "import sys; sys.modules['gcsfs'] = None\n"  # as if the package were not installed
        "from torch_dataloader_utils import StructuredDataset\n"
        "try:\n    StructuredDataset('gs://bucket/data/')\n"
        "except ImportError as error:\n    print(error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert 'for gs:// paths, pip install gcsfs (or, in a checkout of this library: pip install -e ".[gcs]")' in out, out


def test_a_table_directory_is_refused_naming_the_table_dataset(tmp_path, s3):
    """A Delta or Iceberg table's directory holds files the table replaced (here a delete rewrote
    one): read as plain files their rows would come twice. Refused, also as a mixture's source; a
    glob over the files reads them as they lie."""
    pytest.importorskip("deltalake")
    from deltalake import DeltaTable, write_deltalake
    from table_helpers import iceberg_config, iceberg_table, rows

    from torch_dataloader_utils import Source

    delta = str(tmp_path / "delta")
    write_deltalake(delta, rows(0, 100))
    DeltaTable(delta).delete("id < 10")
    with pytest.raises(ValueError, match=r"is a Delta table \(it holds _delta_log/\).*DeltaDataset.*\*\*/\*\.parquet"):
        StructuredDataset(delta, num_workers=0)
    write_dataset(tmp_path / "files", [[20]])
    with pytest.raises(ValueError, match="is a Delta table"):
        StructuredDataset([Source(str(tmp_path / "files")), Source(delta + "/")], num_workers=0)
    assert len(StructuredDataset(delta + "/**/*.parquet", num_workers=0)) == 190  # both versions of the rewritten file
    with pytest.raises(ValueError, match=r"delta' is a Delta table"):  # found below a directory given
        StructuredDataset(str(tmp_path), num_workers=0)
    write_dataset(tmp_path / "delta" / "part=0", [[5]])
    with pytest.raises(ValueError, match=r"delta' is a Delta table"):  # or above it
        StructuredDataset(str(tmp_path / "delta" / "part=0"), num_workers=0)
    sidecar = tmp_path / "sidecar"
    write_dataset(sidecar / "metadata", [[10]])
    (sidecar / "metadata" / "run.metadata.json").write_text("{}")  # not a name an Iceberg writer gives
    assert len(StructuredDataset(str(sidecar), num_workers=0)) == 10

    os.makedirs(tmp_path / "warehouse")
    table = iceberg_table(iceberg_config(str(tmp_path / "warehouse")))
    table.append(rows(0, 50))
    location = table.location().removeprefix("file://")
    with pytest.raises(ValueError, match=r"is an Iceberg table \(it holds metadata/\*\.metadata\.json\).*IcebergDataset"):
        StructuredDataset(location, num_workers=0)
    with pytest.raises(ValueError, match="is an Iceberg table"):  # a directory inside one
        StructuredDataset(location + "/data", num_workers=0)
    for folder, _, names in os.walk(delta):  # an object store's listing finds the log too
        for name in names:
            relative = os.path.relpath(os.path.join(folder, name), delta)
            s3.fs.pipe_file(s3.url(f"lake/delta/{relative}").split("://", 1)[1], open(os.path.join(folder, name), "rb").read())
    s3.fs.invalidate_cache()
    with pytest.raises(ValueError, match=r"lake/delta' is a Delta table"):
        StructuredDataset(s3.url("lake"), num_workers=0, storage_options=s3.options)


def test_a_partition_directory_whose_key_starts_with_an_underscore_is_read(tmp_path):
    """Spark's partitionBy("_key") writes _key=0/ directories and reads them back; other names
    starting with '_' (_SUCCESS, _temporary/) stay hidden."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for key in (0, 1):
        (tmp_path / f"_key={key}").mkdir()
        pq.write_table(pa.table({"id": [key * 10, key * 10 + 1]}), tmp_path / f"_key={key}" / "part-0.parquet")
    (tmp_path / "_temporary" / "0").mkdir(parents=True)
    pq.write_table(pa.table({"id": [99]}), tmp_path / "_temporary" / "0" / "part-0.parquet")
    (tmp_path / "_SUCCESS").write_bytes(b"")
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), partitioning="hive", batch_size=8, num_workers=0, output_format="dict")
    (batch,) = list(loader)
    assert sorted(zip(batch["id"], batch["_key"])) == [(0, 0), (1, 0), (10, 1), (11, 1)]
    assert len(dataset.files) == 2


def test_a_local_path_that_exists_is_read_as_that_path_whatever_characters_it_holds(tmp_path):
    """'exp[2024]' and 'run?.parquet' were globs: the directory found nothing, the file found its neighbour too."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "exp[2024]").mkdir()
    pq.write_table(pa.table({"id": [1]}), tmp_path / "exp[2024]" / "a.parquet")
    pq.write_table(pa.table({"id": [2]}), tmp_path / "run?.parquet")
    pq.write_table(pa.table({"id": [3]}), tmp_path / "run1.parquet")
    for path, ids in ((tmp_path / "exp[2024]", [1]), (tmp_path / "run?.parquet", [2]), (str(tmp_path) + "/run*.parquet", [2, 3])):
        loader, _ = StructuredDataset.create_dataloader(str(path), batch_size=8, num_workers=0)
        assert sorted(i for batch in loader for i in batch["id"].tolist()) == ids


def test_a_symbolic_link_to_a_directory_above_it_is_named(tmp_path):
    """The walk followed it until the OS refused a path of about 40 links (a bare ELOOP OSError)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "sub").mkdir()
    pq.write_table(pa.table({"id": [1]}), tmp_path / "sub" / "a.parquet")
    os.symlink(str(tmp_path), tmp_path / "sub" / "up")
    with pytest.raises(ValueError, match=r"'.*sub/up' is a symbolic link to .*, a directory that holds it"):
        StructuredDataset(str(tmp_path), num_workers=0)


@pytest.mark.parametrize("form", ["directory", "path", "glob"])
def test_a_named_pipe_named_like_a_data_file_is_refused_naming_it(tmp_path, form):
    """Planning opened it to read a footer and waited for a writer forever."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1]}), tmp_path / "a.parquet")
    os.mkfifo(tmp_path / "b.parquet")
    path = {"directory": str(tmp_path), "path": str(tmp_path / "b.parquet"), "glob": str(tmp_path / "*.parquet")}[form]
    with pytest.raises(ValueError, match=r"'.*b\.parquet' is a named pipe \(FIFO\), not a regular file"):
        StructuredDataset(path, num_workers=0)
