"""Lakehouse tables (Apache Iceberg, Delta Lake): a snapshot's data files planned like plain files."""
