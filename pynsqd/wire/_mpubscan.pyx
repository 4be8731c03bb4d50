# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled twin of ``pynsqd.wire.mpubscan.scan_bodies``: the same messages and the same
errors, in a C loop (one ``bytes`` per message). Reads stay inside what has arrived
(``avail`` bytes from ``start``), which is checked against the buffer first."""

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, uint8_t, uint32_t

from pynsqd.wire.errors import ProtocolError


def scan_bodies(bytearray buf not None, Py_ssize_t start, Py_ssize_t off, Py_ssize_t avail, Py_ssize_t size,
                Py_ssize_t count, Py_ssize_t max_msg, list bodies not None):
    cdef const uint8_t[::1] view = buf
    cdef const uint8_t* p
    cdef Py_ssize_t i = len(bodies), msg_size
    if start < 0 or avail < 0 or start + avail > view.shape[0]:
        raise ValueError(f"{avail} bytes at {start} are not in a {view.shape[0]}-byte buffer")
    p = &view[0] + start if view.shape[0] else NULL
    while i < count:
        if size - off < 4:
            raise ProtocolError("E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
        if avail - off < 4:
            break
        msg_size = <int32_t>((<uint32_t>p[off] << 24) | (<uint32_t>p[off + 1] << 16)
                             | (<uint32_t>p[off + 2] << 8) | p[off + 3])
        if msg_size <= 0:
            raise ProtocolError("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {msg_size}")
        if msg_size > max_msg:
            raise ProtocolError("E_BAD_MESSAGE", f"MPUB message too big {msg_size} > {max_msg}")
        if size - off - 4 < msg_size:
            raise ProtocolError("E_BAD_MESSAGE", "MPUB failed to read message body")
        if avail - off - 4 < msg_size:
            break
        bodies.append(PyBytes_FromStringAndSize(<const char*>p + off + 4, msg_size))
        off += 4 + msg_size
        i += 1
    return off
