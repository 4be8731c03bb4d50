"""The output file of ``nsq_to_file``: naming, rotation, gzip, sync, and atomic hand-over.

Theory of operation. Lines are appended to one open file per topic. A file is *complete*
when it is rotated (``--rotate-size`` bytes written, ``--rotate-interval`` elapsed, or the
``<DATETIME>`` part of its name changed) or when the program exits. Until then it lives in
``--work-dir`` under a hidden name (``.<name>.tmp``), so readers that scan ``--output-dir``
(Spark's file sources skip names starting with ``.``) never see a partial file; completing
it means: finish the gzip stream, flush, ``fsync``, close, then ``rename`` it to its final
name in ``--output-dir`` (``fsync`` of the directory too). The rename never replaces an
existing file: ``<REV>`` is raised until the name is free. NSQ itself writes in-progress
files under their final name when ``--work-dir`` is the output dir; the hidden name is the
one deliberate difference.

``sync()`` (flush + ``fsync``, gzip stream flushed with ``Z_SYNC_FLUSH``) is what
``nsq_to_file`` calls before it FINs the messages it wrote, so a FINed message is on disk.
Time comes in as arguments (``now``: ``time.time()`` seconds), so rotation is testable.
"""

from __future__ import annotations

import gzip
import os
import shutil
import socket
import time
import zlib
from dataclasses import dataclass
from typing import BinaryIO


@dataclass
class FileLogConfig:
    output_dir: str = "/tmp"
    work_dir: str = ""
    filename_format: str = "<TOPIC>.<HOST><REV>.<DATETIME>.log"
    datetime_format: str = "%Y-%m-%d_%H"
    host_identifier: str = ""
    gzip: bool = False
    gzip_level: int = 6
    rotate_size: int = 0          # bytes; 0 = never
    rotate_interval: float = 0.0  # seconds; 0 = never
    skip_empty_files: bool = False


def host_name(identifier: str) -> str:
    """``<HOST>``: ``--host-identifier`` with ``<SHORT_HOST>``/``<HOSTNAME>`` replaced, or the hostname."""
    hostname = socket.gethostname()
    if not identifier:
        return hostname
    return identifier.replace("<SHORT_HOST>", hostname.split(".")[0]).replace("<HOSTNAME>", hostname)


def effective_format(config: FileLogConfig) -> str:
    fmt = config.filename_format
    if config.gzip and not fmt.endswith(".gz"):
        fmt += ".gz"
    return fmt


class FileLog:
    """One topic's output file; see the module docstring. Not thread-safe."""

    def __init__(self, topic: str, config: FileLogConfig) -> None:
        self.topic = topic
        self.config = config
        self.output_dir = config.output_dir
        self.work_dir = config.work_dir or config.output_dir
        self._format = effective_format(config)
        self._host = host_name(config.host_identifier)
        self._raw: BinaryIO | None = None
        self._out: BinaryIO | gzip.GzipFile | None = None
        self._work_path = ""
        self._name_datetime = ""
        self._opened_at = 0.0
        self._rev = 0
        self.bytes_written = 0   # uncompressed bytes in the current file
        self.lines = 0
        self.completed: list[str] = []  # final paths of the files completed so far

    @property
    def is_open(self) -> bool:
        return self._out is not None

    def filename(self, now: float, rev: int) -> str:
        datetime_text = time.strftime(self.config.datetime_format, time.localtime(now))
        name = (self._format.replace("<TOPIC>", self.topic).replace("<HOST>", self._host)
                .replace("<PID>", str(os.getpid())).replace("<DATETIME>", datetime_text))
        return name.replace("<REV>", f"-{rev}" if rev > 0 else "")

    def open(self, now: float) -> None:
        """Start a new file (called lazily by ``write``, or eagerly unless skip-empty-files)."""
        if self._out is not None:
            return
        os.makedirs(self.work_dir, exist_ok=True)
        os.makedirs(self.output_dir, exist_ok=True)
        self._name_datetime = time.strftime(self.config.datetime_format, time.localtime(now))
        self._rev = 0
        while self._taken(self.filename(now, self._rev)):
            self._rev += 1
        name = self.filename(now, self._rev)
        self._work_path = os.path.join(self.work_dir, f".{name}.tmp")
        self._raw = open(self._work_path, "xb")
        if self.config.gzip:
            self._out = gzip.GzipFile(filename=name.removesuffix(".gz"), mode="wb", fileobj=self._raw,
                                      compresslevel=self.config.gzip_level, mtime=int(now))
        else:
            self._out = self._raw
        self._opened_at = now
        self.bytes_written = 0
        self.lines = 0

    def _taken(self, name: str) -> bool:
        return (os.path.exists(os.path.join(self.output_dir, name))
                or os.path.exists(os.path.join(self.work_dir, f".{name}.tmp")))

    def write(self, line: bytes, now: float) -> None:
        """Append ``line`` and a newline (opening a file first if none is open)."""
        if self._out is None:
            self.open(now)
        assert self._out is not None
        self._out.write(line)
        self._out.write(b"\n")
        self.bytes_written += len(line) + 1
        self.lines += 1

    def needs_rotation(self, now: float) -> bool:
        if self._out is None:
            return False
        c = self.config
        if c.rotate_size > 0 and self.bytes_written >= c.rotate_size:
            return True
        if c.rotate_interval > 0 and now - self._opened_at >= c.rotate_interval:
            return True
        return time.strftime(c.datetime_format, time.localtime(now)) != self._name_datetime

    def sync(self) -> None:
        """Make everything written so far durable (flush + fsync)."""
        if self._out is None or self._raw is None:
            return
        if isinstance(self._out, gzip.GzipFile):
            self._out.flush(zlib.Z_SYNC_FLUSH)
        self._raw.flush()
        os.fsync(self._raw.fileno())

    def close(self, now: float) -> str | None:
        """Complete the current file and move it into the output dir; returns its final path
        (None when no file was open, or it was empty and skip-empty-files is set)."""
        if self._out is None or self._raw is None:
            return None
        out, raw = self._out, self._raw
        self._out = self._raw = None
        if out is not raw:
            out.close()  # writes the gzip trailer
        raw.flush()
        os.fsync(raw.fileno())
        raw.close()
        if self.lines == 0 and self.config.skip_empty_files:
            os.unlink(self._work_path)
            return None
        source = self._work_path
        if os.stat(source).st_dev != os.stat(self.output_dir).st_dev:
            source = self._copy_to_output(source)  # a link cannot cross file systems
        rev = self._rev
        while True:
            final = os.path.join(self.output_dir, self.filename(self._opened_at, rev))
            try:
                os.link(source, final)  # fails if the name exists: never overwrite
                break
            except FileExistsError:
                rev += 1
        os.unlink(source)
        if source != self._work_path:
            os.unlink(self._work_path)
        _fsync_dir(self.output_dir)
        if self.work_dir != self.output_dir:
            _fsync_dir(self.work_dir)
        self.completed.append(final)
        return final


    def _copy_to_output(self, source: str) -> str:
        target = os.path.join(self.output_dir, os.path.basename(source))  # still hidden
        shutil.copyfile(source, target)
        with open(target, "rb") as fh:
            os.fsync(fh.fileno())
        return target


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
