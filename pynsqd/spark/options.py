"""The `nsq` data source's options, parsed and checked once on the driver.

Spark hands a data source its options as a case-insensitive ``str → str`` mapping. Names
follow NSQ's flags in camelCase (``nsqdTCPAddresses`` for ``--nsqd-tcp-address``); a bad or
missing value raises ``ValueError`` with the option's name, which Spark shows to the user as
the query's error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pynsqd.wire.names import is_valid_name

# Spark's cost per micro-batch is mostly fixed (planning, task launch, the sink's and the logs'
# commits: a few hundred ms on local[2]), so a batch carries about as many rows as a cycle
# costs: at 100,000 rows of 100 B a cycle on local[2] is ~0.4 s of Spark's own time with the
# ceiling's rate source.
DEFAULT_MAX_BATCH = 100_000
# A batch stays in flight until the next one is planned: two batches and what arrives meanwhile.
IN_FLIGHT_PER_BATCH = 3
DEFAULT_MAX_BATCH_DELAY_MS = 1000  # a batch smaller than minBatch goes after this long


def _list(opts: Mapping[str, str], *names: str) -> list[str]:
    for name in names:
        raw = opts.get(name)
        if raw:
            return [part.strip() for part in raw.split(",") if part.strip()]
    return []


def _int(opts: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = opts.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"option {name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"option {name}={value} must be >= {minimum}")
    return value


def _name(opts: Mapping[str, str], name: str, required: bool = True) -> str:
    value = opts.get(name) or ""
    if not value:
        if required:
            raise ValueError(f"option {name} is required")
        return ""
    if not is_valid_name(value):
        raise ValueError(f"option {name}={value!r} is not a valid NSQ {name} name")
    return value


@dataclass(frozen=True)
class SourceOptions:
    """What ``spark.readStream.format("nsq").option(...)`` configures."""

    nsqd: tuple[str, ...]
    lookupd: tuple[str, ...]
    topic: str
    channel: str  # default "spark"
    max_batch: int
    max_in_flight: int
    msg_timeout_ms: int
    partitions: int
    driver_host: str = ""  # "": chosen like spark.driver.host (server.default_host)
    driver_port: int = 0  # 0: any free port
    min_batch: int = 0  # 0: a batch takes whatever arrived since the last one (parse: maxBatch)
    max_batch_delay_ms: int = 0

    @classmethod
    def parse(cls, opts: Mapping[str, str]) -> SourceOptions:
        nsqd = _list(opts, "nsqdTCPAddresses", "nsqd")
        lookupd = _list(opts, "lookupdHTTPAddresses", "lookupd")
        if not nsqd and not lookupd:
            raise ValueError("option nsqdTCPAddresses or lookupdHTTPAddresses is required")
        # A batch's messages stay in flight until the *next* batch is planned (that is when Spark
        # calls commit), so two batches plus what is buffered must fit in max-in-flight.
        if opts.get("maxInFlight"):
            max_in_flight = _int(opts, "maxInFlight", 0)
            max_batch = _int(opts, "maxBatch", max(1, max_in_flight // IN_FLIGHT_PER_BATCH))
        else:
            max_batch = _int(opts, "maxBatch", DEFAULT_MAX_BATCH)
            max_in_flight = IN_FLIGHT_PER_BATCH * max_batch
        if 2 * max_batch >= max_in_flight:
            raise ValueError(f"option maxInFlight={max_in_flight} must exceed 2 x maxBatch={max_batch}: "
                             "a batch stays in flight until the next one commits it")
        # Kafka's minOffsetsPerTrigger / maxTriggerDelay: by default a batch waits to be full for
        # at most maxBatchDelay, so a slow stream makes one batch a delay (one set of output
        # files, one cycle of Spark's fixed cost) instead of one per cycle; 0 takes what came
        min_batch = _int(opts, "minBatch", max_batch, minimum=0)
        if min_batch > max_batch:
            raise ValueError(f"option minBatch={min_batch} must not exceed maxBatch={max_batch}")
        max_delay = _int(opts, "maxBatchDelay", DEFAULT_MAX_BATCH_DELAY_MS, minimum=0)
        port = _int(opts, "driverPort", 0, minimum=0)
        if port > 65535:
            raise ValueError(f"option driverPort={port} is not a TCP port")
        return cls(
            nsqd=tuple(nsqd), lookupd=tuple(lookupd),
            topic=_name(opts, "topic"),
            channel=_name(opts, "channel", required=False) or "spark",
            max_batch=max_batch, max_in_flight=max_in_flight,
            msg_timeout_ms=_int(opts, "msgTimeout", 60_000, minimum=1000),
            partitions=_int(opts, "partitions", 2),
            driver_host=opts.get("driverHost") or "", driver_port=port,
            min_batch=min_batch, max_batch_delay_ms=max_delay,
        )


@dataclass(frozen=True)
class SinkOptions:
    """What ``df.write.format("nsq").option(...)`` configures."""

    nsqd: str
    topic: str
    max_body_size: int
    max_msg_size: int

    @classmethod
    def parse(cls, opts: Mapping[str, str]) -> SinkOptions:
        nsqd = _list(opts, "nsqdTCPAddress", "nsqdTCPAddresses", "nsqd")
        if len(nsqd) != 1:
            raise ValueError("option nsqdTCPAddress must name exactly one nsqd (host:port)")
        return cls(
            nsqd=nsqd[0],
            topic=_name(opts, "topic", required=False),
            max_body_size=_int(opts, "maxBodySize", 5 * 1024 * 1024, minimum=1024),
            max_msg_size=_int(opts, "maxMsgSize", 1024 * 1024, minimum=64),
        )
