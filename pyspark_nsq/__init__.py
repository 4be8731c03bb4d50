"""Auto-registration of the ``nsq`` data source: PySpark imports every top-level module named
``pyspark_*`` that exposes a ``DefaultSource`` and registers it under its ``name()``."""

from __future__ import annotations

from pynsqd.spark.datasource import NSQDataSource as DefaultSource

__all__ = ["DefaultSource"]
