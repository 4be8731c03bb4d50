"""Opening a disk queue after a clean close or a crash: trust the metadata when the files agree
with it, otherwise scan the files (``diskqueue.py`` describes the cases).

Scanning reads 1 MiB at a time and walks record headers in memory (``scan_records``), so
recounting a 100 MiB file of 226-byte records takes about a tenth of a second. It runs only
at open when something is off, and after corruption is found while reading.
"""

from __future__ import annotations

import functools
import logging
import os
import re

from pynsqd.shm import diskqueue_format as fmt
from pynsqd.shm.diskqueue_format import HEADER, HEADER_SIZE, Meta, Stop

SCAN_CHUNK = 1 << 20
_DATA_SUFFIX = re.compile(r"(\d{6,})\.dat")  # a data file's name past ``<name>.diskqueue.``
_META_TMP_SUFFIX = re.compile(r"meta\.dat\.\d+\.tmp")  # a metadata temp file's, likewise


class Scanner:
    """File-level helpers for one queue: list, scan and count its data files, recover its state."""

    def __init__(self, name: str, data_path: str, min_size: int, max_size: int,
                 log: logging.Logger) -> None:
        self.name = name
        self.dir = data_path
        self.min_size = min_size
        self.max_size = max_size
        self.log = log
        self._prefix = f"{name}.diskqueue."  # every file of the queue's starts so

    # compiled only when the queue is deleted: a node opening thousands of queues would
    # otherwise compile it for each (opening matches the part past ``_prefix`` instead)

    @functools.cached_property
    def _all_re(self) -> re.Pattern[str]:
        return fmt.all_files_pattern(self.name)


    def path(self, file_num: int) -> str:
        return os.path.join(self.dir, fmt.data_file_name(self.name, file_num))

    def _candidates(self) -> list[str]:
        """Names in the directory that may be this queue's files."""
        prefix = self._prefix
        return [f for f in os.listdir(self.dir) if f.startswith(prefix)]

    def data_files(self, candidates: list[str] | None = None) -> list[int]:
        """Numbers of the data files present, ascending (``fmt.data_file_pattern``: the
        queue's prefix, then a pattern shared by every queue)."""
        names = self._candidates() if candidates is None else candidates
        at = len(self._prefix)
        return sorted(int(m[1]) for m in (_DATA_SUFFIX.fullmatch(n, at) for n in names) if m) if names else []

    def all_files(self) -> list[str]:
        return [os.path.join(self.dir, f) for f in self._candidates() if self._all_re.fullmatch(f)]

    def scan_file(self, file_num: int, pos: int, limit: int | None = None) -> tuple[int, int, Stop]:
        """Count whole records from ``pos`` to ``limit`` (default: the file's end).

        Returns ``(count, position after the last whole record, why the scan stopped)``;
        a missing file counts 0 records and ends ``END``.
        """
        try:
            fd = os.open(self.path(file_num), os.O_RDONLY)
        except FileNotFoundError:
            return 0, pos, Stop.END
        try:
            size = os.fstat(fd).st_size
            stop = size if limit is None else min(limit, size)
            count, need = 0, HEADER_SIZE
            while pos < stop:
                want = min(max(SCAN_CHUNK, need), stop - pos)
                if want < need:
                    return count, pos, Stop.PARTIAL
                buf = os.pread(fd, want, pos)
                got, end, why = fmt.scan_records(buf, 0, len(buf), self.min_size, self.max_size)
                count += got
                if why is Stop.CORRUPT or len(buf) < want:
                    return count, pos + end, why
                need = HEADER_SIZE
                if why is Stop.PARTIAL and end + HEADER_SIZE <= len(buf):
                    need += HEADER.unpack_from(buf, end)[0]
                pos += end
            return count, pos, Stop.END
        finally:
            os.close(fd)

    def count_from(self, read_file: int, write_file: int, write_pos: int) -> int:
        """Records a reader will still get from the start of ``read_file`` to the write position."""
        total = 0
        for num in self.data_files():
            if read_file <= num <= write_file:
                total += self.scan_file(num, 0, write_pos if num == write_file else None)[0]
        return total

    # ------------------------------------------------------------------ open

    def open(self) -> Meta:
        """The state to resume from, after repairing what a crash left. Raises ``OSError``."""
        candidates = self._candidates()
        at = len(self._prefix)
        for entry in candidates:
            if _META_TMP_SUFFIX.fullmatch(entry, at):  # a metadata write a crash cut
                os.unlink(os.path.join(self.dir, entry))
        files = self.data_files(candidates)
        meta = self._load_meta()
        if meta is None:
            if not files:
                return Meta(0, 0, 0, 0, 0)
            self.log.warning("DISKQUEUE(%s) no usable metadata, recovering from %d data file(s)",
                             self.name, len(files))
            return self._rebuild(files, files[0], 0, files[-1])
        if not meta.is_sane():
            self.log.error("DISKQUEUE(%s) inconsistent metadata %r, rescanning", self.name, meta)
            start = files[0] if files else 0
            return self._rebuild(files, start, 0, max([*files, meta.write_file, 0]))
        orphans = [n for n in files if n < meta.read_file]
        if orphans:
            self.log.warning("DISKQUEUE(%s) files before the read file left in place: %s",
                             self.name, orphans)
        size = _size(self.path(meta.write_file))
        if (files and files[-1] > meta.write_file) or size < meta.write_pos:
            self.log.error("DISKQUEUE(%s) data files do not match metadata (write file %d is %d bytes, "
                           "metadata says %d; last file %d), rescanning", self.name, meta.write_file,
                           size, meta.write_pos, files[-1] if files else -1)
            return self._rebuild(files, meta.read_file, meta.read_pos, meta.write_file)
        if size > meta.write_pos:
            return self._recover_tail(meta, size)
        return meta

    def _load_meta(self) -> Meta | None:
        path = os.path.join(self.dir, fmt.meta_file_name(self.name))
        try:
            with open(path, "rb") as f:
                return Meta.decode(f.read(4096))
        except FileNotFoundError:
            return None
        except ValueError as exc:
            self.log.error("DISKQUEUE(%s) unreadable metadata - %s", self.name, exc)
            return None

    def _recover_tail(self, meta: Meta, size: int) -> Meta:
        """Stale metadata: bytes after the recorded write position of the write file."""
        count, end, why = self.scan_file(meta.write_file, meta.write_pos)
        if why is Stop.PARTIAL:
            self.log.warning("DISKQUEUE(%s) cutting a torn record off %s at %d (%d bytes)",
                             self.name, self.path(meta.write_file), end, size - end)
            os.truncate(self.path(meta.write_file), end)
        if count == 0 and why is not Stop.CORRUPT:
            return meta
        self.log.warning("DISKQUEUE(%s) %d record(s) after the metadata's write position %d in %s; "
                         "keeping them and writing to the next file", self.name, count,
                         meta.write_pos, self.path(meta.write_file))
        return Meta(meta.depth + count, meta.read_file, meta.read_pos, meta.write_file + 1, 0)

    def _rebuild(self, files: list[int], read_file: int, read_pos: int, last: int) -> Meta:
        """Count every record from the read position on, cut a torn tail off the last file,
        and continue writing in a new file after all of them."""
        depth = 0
        present = [n for n in files if n >= read_file]
        for num in present:
            count, end, why = self.scan_file(num, read_pos if num == read_file else 0)
            depth += count
            if why is Stop.PARTIAL and num == present[-1]:
                self.log.warning("DISKQUEUE(%s) cutting a torn record off %s at %d",
                                 self.name, self.path(num), end)
                os.truncate(self.path(num), end)
            elif why is not Stop.END:
                self.log.warning("DISKQUEUE(%s) %s is corrupt at %d; it will be skipped from there",
                                 self.name, self.path(num), end)
        write_file = max([*present, last]) + 1
        self.log.info("DISKQUEUE(%s) recovered depth %d, reading %d:%d, writing file %d",
                      self.name, depth, read_file, read_pos, write_file)
        return Meta(depth, read_file, read_pos, write_file, 0)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
