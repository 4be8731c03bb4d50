"""Where a durable queue's deferred messages wait outside shared memory.

Two files per durable queue (formats in ``pynsqd.shm.sidecar``): the *sidecar* holds the
deferred messages across a clean exit (written by ``save`` as the queue leaves shared
memory); the *journal* holds, while the process runs, each deferred message that found no
room in the log (appended by ``hold`` before the message is acknowledged; the owner keeps
it in memory meanwhile). A journaled message stored elsewhere later is struck off
(``strike``), and the journal goes once none is left. At start ``load`` puts both files'
messages back into the log as deferred records and rewrites the journal with those that
still found no room. Every failure to update a file keeps it as it was: its messages are
loaded again next time (a duplicate, never a loss).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

from pynsqd.shm import sidecar as sidecar_file
from pynsqd.shm.logrecovery import Deferred

logger = logging.getLogger("pynsqd.shard")

# (message, due wall ns) -> its position in the log, or None without room
Place = Callable[[bytes, int], "int | None"]


class DeferredFiles:
    """The sidecar and the journal of one durable queue."""

    __slots__ = ("journal", "journaled", "sidecar")

    def __init__(self, sidecar: str) -> None:
        self.sidecar = sidecar  # where deferred messages wait across a clean exit
        self.journal = sidecar_file.journal_of(sidecar)  # ... and those without room in the log meanwhile
        self.journaled = 0  # messages in the journal not yet stored elsewhere

    def load(self, place: Place) -> Deferred:
        """The deferred messages of the sidecar (a clean exit) and of the journal (no room
        while running), each given to ``place``: [(pos, due wall ns, message)], pos -1 for
        one that found no room. Those still without room become the journal; then the
        sidecar is removed (a crash in between loads some twice, never loses one)."""
        out = []
        unplaced = []
        for due, message in sidecar_file.read(self.sidecar, logger) + sidecar_file.read_journal(self.journal, logger):
            pos = place(message, due)
            if pos is None:
                unplaced.append((due, message))
            out.append((-1 if pos is None else pos, due, message))
        if out or os.path.exists(self.journal):  # rewritten: no torn tail left to append behind
            try:
                sidecar_file.write_journal(self.journal, unplaced)
                self.journaled = len(unplaced)
                sidecar_file.remove(self.sidecar)
            except OSError as exc:  # kept: loaded again next time (a duplicate, never a loss)
                logger.error("failed to rewrite %s - %s", self.journal, exc)
                self.journaled = len(out)
        return out

    def hold(self, due: int, message: bytes) -> None:
        """Journal a deferred message that found no room in the log (one ``write``; raises
        ``OSError`` when it cannot: then it is not stored)."""
        sidecar_file.append_journal(self.journal, due, message)
        self.journaled += 1

    def strike(self, messages: Sequence[bytes]) -> None:
        """``messages`` that ``hold`` journaled are stored elsewhere now (the log, the
        backend, a channel): struck off the journal (one write), which is removed when none
        is left."""
        if not messages or not self.journaled:
            return
        self.journaled = max(0, self.journaled - len(messages))
        if not self.journaled:
            self._remove(self.journal)
            return
        try:
            sidecar_file.strike_journal(self.journal, messages)
        except OSError as exc:  # loaded again next time (a duplicate, never a loss)
            logger.error("failed to update %s - %s", self.journal, exc)

    def save(self, deferred: list[tuple[int, bytes]]) -> None:
        """A clean exit: every deferred message [(due wall ns, message)] into the sidecar,
        and the journal goes (raises ``OSError``: then the journal stays)."""
        sidecar_file.write(self.sidecar, deferred)
        sidecar_file.remove(self.journal)

    def remove(self) -> None:
        """The queue was emptied: neither file holds anything of it any more."""
        self.journaled = 0
        self._remove(self.sidecar)
        self._remove(self.journal)

    def _remove(self, path: str) -> None:
        try:
            sidecar_file.remove(path)
        except OSError as exc:  # kept: loaded again next time (a duplicate, never a loss)
            logger.error("failed to remove %s - %s", path, exc)
