"""``pynsqd.spark``: NSQ for Apache Spark (PySpark ≥ 4.0, the optional ``spark`` extra).

Owns the ``nsq`` data source — a streaming source that is at-least-once end to end
(``source.py``, ``feed.py``, ``parts.py``, ``server.py``) and a batch/streaming sink (``sink.py``) — and the
``nsq_spark_pipeline`` command (``pipeline.py``). The broker never imports it.

Registration: installing ``pynsqd[spark]`` installs the top-level module ``pyspark_nsq``,
which Spark's Python data source lookup finds on its own (modules named ``pyspark_*``
exposing ``DefaultSource``), so ``format("nsq")`` works in any new session. Where that lookup
is unavailable (a cluster whose workers lack the package, a session created before install),
one call does it: ``pynsqd.spark.register(spark)``.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register ``format("nsq")`` with ``spark`` (a ``SparkSession``)."""
    from pynsqd.spark.datasource import NSQDataSource

    spark.dataSource.register(NSQDataSource)


__all__ = ["register"]
