# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled twin of ``pynsqd.wire.frameruns``: the same offsets and the same command
bytes, in C loops."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t, uint8_t, uint32_t
from libc.string cimport memcpy

cdef enum:
    FRAME_MESSAGE = 2
    MIN_MESSAGE_SIZE = 30  # type 4 + message header 26
    ID_AT = 18


cdef inline int32_t _be32(const uint8_t* p) noexcept:
    return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3])


def scan_messages(bytearray buf not None, Py_ssize_t pos, Py_ssize_t limit, list offsets not None):
    cdef const uint8_t[::1] view = buf
    cdef Py_ssize_t end = view.shape[0]
    cdef const uint8_t* p
    cdef int32_t size
    if pos < 0:
        raise ValueError(f"position {pos} is not in the buffer")
    if end == 0:
        return pos
    p = &view[0]
    while end - pos >= 8:
        size = _be32(p + pos)
        if _be32(p + pos + 4) != FRAME_MESSAGE or size < MIN_MESSAGE_SIZE or size > limit or size > end - pos - 4:
            break
        offsets.append(pos)
        pos += 4 + size
    return pos


def id_commands(bytes verb not None, bytes frames not None, list offsets not None):
    cdef Py_ssize_t n = len(offsets) - 1
    cdef Py_ssize_t vlen = PyBytes_GET_SIZE(verb)
    cdef Py_ssize_t flen = PyBytes_GET_SIZE(frames)
    cdef Py_ssize_t line = vlen + 18, i, o
    cdef const char* src = PyBytes_AS_STRING(frames)
    cdef const char* v = PyBytes_AS_STRING(verb)
    cdef bytes out
    cdef char* q
    if n <= 0:
        return b""
    for i in range(n):  # every id inside the frames, before anything is written
        o = offsets[i]
        if o < 0 or o + ID_AT + 16 > flen:
            raise ValueError(f"frame offset {o} is not in the {flen} bytes of frames")
    out = PyBytes_FromStringAndSize(NULL, n * line)
    q = PyBytes_AS_STRING(out)
    for i in range(n):
        o = offsets[i]
        memcpy(q, v, vlen)
        q[vlen] = 32  # b" "
        memcpy(q + vlen + 1, src + o + ID_AT, 16)
        q[vlen + 17] = 10  # b"\n"
        q += line
    return out
