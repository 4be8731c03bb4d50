"""``NSQDataSource``: the class Spark knows as ``format("nsq")``.

Spark builds it on the driver with the query's options and pickles it; it only parses options
and hands out the stream reader (``source.py``) and the writers (``sink.py``). It never opens a
socket or a thread (it is pickled and reused everywhere).
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from pynsqd.spark.options import SinkOptions, SourceOptions
from pynsqd.spark.parts import SCHEMA_DDL


class NSQDataSource(DataSource):
    """``spark.readStream.format("nsq")``, ``df.write.format("nsq")``, ``df.writeStream.format("nsq")``."""

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from pynsqd.spark.source import NSQStreamReader

        return NSQStreamReader(SourceOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from pynsqd.spark.sink import NSQWriter, check_schema

        check_schema(schema.fieldNames())
        return NSQWriter(SinkOptions.parse(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from pynsqd.spark.sink import NSQStreamWriter, check_schema

        check_schema(schema.fieldNames())
        return NSQStreamWriter(SinkOptions.parse(self.options))
