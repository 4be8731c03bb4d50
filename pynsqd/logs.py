"""Logging as NSQ's daemons print it: ``[nsqd] 2026/11/22 05:20:00.123456 INFO: message``."""

from __future__ import annotations

import logging
import sys
import time

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
          "error": logging.ERROR, "fatal": logging.CRITICAL}
_NAMES = {logging.DEBUG: "DEBUG", logging.INFO: "INFO", logging.WARNING: "WARNING",
          logging.ERROR: "ERROR", logging.CRITICAL: "FATAL"}


class NsqFormatter(logging.Formatter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(record.created))
        micros = int((record.created % 1) * 1_000_000)
        text = f"{self.prefix}{stamp}.{micros:06d} {_NAMES.get(record.levelno, record.levelname)}: " \
               f"{record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def setup(prefix: str, level: str) -> None:
    """Send pynsqd's logs to stderr with NSQ's prefix and format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(NsqFormatter(prefix))
    root = logging.getLogger("pynsqd")
    root.handlers[:] = [handler]
    root.setLevel(LEVELS[level.lower()])
    root.propagate = False


def set_level(level: str) -> None:
    logging.getLogger("pynsqd").setLevel(LEVELS[level])
