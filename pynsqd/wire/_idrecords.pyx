# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled twin of ``pynsqd.wire.idrecords.make_records``: the same bytes, each record
made in one allocation with its id's hex digits written in place."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport uint64_t
from libc.string cimport memcpy

cdef const char* _HEX = b"0123456789abcdef"


def make_records(bytes prefix not None, uint64_t first, uint64_t step, bodies):
    cdef Py_ssize_t plen = PyBytes_GET_SIZE(prefix)
    cdef Py_ssize_t blen
    cdef const char* pre = PyBytes_AS_STRING(prefix)
    cdef uint64_t value = first
    cdef list out = []
    cdef bytes body, record
    cdef char* p
    cdef int k
    for obj in bodies:
        body = obj if type(obj) is bytes else bytes(obj)
        blen = PyBytes_GET_SIZE(body)
        record = PyBytes_FromStringAndSize(NULL, plen + 16 + blen)
        p = PyBytes_AS_STRING(record)
        memcpy(p, pre, plen)
        p += plen
        for k in range(16):
            p[15 - k] = _HEX[(value >> (4 * k)) & 15]
        memcpy(p + 16, PyBytes_AS_STRING(body), blen)
        out.append(record)
        value += step
    return out
