# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of ``pynsqd.shm.logscan``: the same functions with the same results,
byte for byte, in C loops over the log's buffer (no Python object per record but the
positions and ids the callers keep). Every index is checked against the record area before
it is read; a run ``deliver_run`` cannot prove whole (a message shorter than NSQ's header,
positions out of order or outside the area) is handed to the pure function as it is."""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.set cimport PySet_Add
from libc.stdint cimport uint8_t, uint32_t
from libc.string cimport memcpy, memset

from pynsqd.shm import logscan as _pure
from pynsqd.shm.frames import RingError

HEADER_SIZE = 192

cdef enum:
    HEADER = 192
    FRAME_SIZE = 8
    STATE_SIZE = 16
    MESSAGE_HEADER = 26
    ATTEMPTS_AT = 24
    ID_AT = 10
    READY = 1
    IN_FLIGHT = 2
    DEFERRED = 3
    DONE = 4

cdef long long WRAP = 0xFFFFFFFF

cdef extern from *:
    """
    static inline unsigned long long pynsqd_load_u64(const void *p) {
        return __atomic_load_n((const unsigned long long *)p, __ATOMIC_ACQUIRE);
    }
    static inline void pynsqd_store_u64(void *p, unsigned long long v) {
        __atomic_store_n((unsigned long long *)p, v, __ATOMIC_RELEASE);
    }
    """
    unsigned long long load_u64 "pynsqd_load_u64"(const void *p) noexcept nogil
    void store_u64 "pynsqd_store_u64"(void *p, unsigned long long v) noexcept nogil

cdef enum:
    WRITE_AT = 64  # the ring header's write index, records written and read index (byte offsets)
    WSEQ_AT = 72
    READ_AT = 128


cdef inline long long _u32(const uint8_t* p) noexcept nogil:
    return p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline void _be32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = (v >> 24) & 0xFF
    p[1] = (v >> 16) & 0xFF
    p[2] = (v >> 8) & 0xFF
    p[3] = v & 0xFF


cdef const uint8_t* _area(const uint8_t[::1] view, long long cap) except NULL:
    if cap < FRAME_SIZE or view.shape[0] < HEADER + cap:
        raise ValueError(f"a {view.shape[0]}-byte buffer has no {cap}-byte record area")
    return &view[HEADER]


cdef tuple _find(const uint8_t* area, long long cap, long long read, long long write, long long cursor,
                 long long max_count, int want):
    cdef long long pos, start, end, size, check, frame, found = 0, left, n
    cdef list runs = []
    cdef list starts, ends
    if cursor < read:
        cursor = read
    while cursor < write and found < max_count:
        pos = start = cursor % cap
        end = pos + min(write - cursor, cap - pos)
        starts = []
        ends = []
        left = max_count - found
        n = 0
        while pos < end and n < left:
            if pos + FRAME_SIZE > cap:
                raise RingError(f"corrupt record frame at {pos} (past the end of the area)")
            size = _u32(area + pos)
            check = _u32(area + pos + 4)
            if size ^ check != WRAP:
                raise RingError(f"corrupt record frame at {pos} (length {size})")
            if size == WRAP:
                pos = cap
                break
            frame = FRAME_SIZE + size + (-size & 7)
            if pos + frame > end or size < STATE_SIZE:
                raise RingError(f"record length {size} at {pos} runs past the written data")
            if area[pos + FRAME_SIZE] == want:
                starts.append(pos + FRAME_SIZE)
                ends.append(pos + FRAME_SIZE + size)
                n += 1
            pos += frame
        if n:
            runs.append((starts, ends))
            found += n
        cursor += pos - start
    return runs, cursor


cdef inline void _le32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = v & 0xFF
    p[1] = (v >> 8) & 0xFF
    p[2] = (v >> 16) & 0xFF
    p[3] = (v >> 24) & 0xFF


def put_one(buf, words, long long cap, long long max_frame, bytes lead not None, bytes record not None):
    """``logscan.put_one``: the bytes copied in, then the record count and the write index
    stored (release stores: the compiler keeps them after the copy, x86 keeps the order)."""
    cdef uint8_t[::1] view = buf
    cdef uint8_t* base
    cdef uint8_t* p
    cdef Py_ssize_t lsize = len(lead), rsize = len(record)
    cdef long long size = lsize + rsize, frame = (size + 15) & ~7
    cdef unsigned long long read, write, start
    if cap < FRAME_SIZE or cap & 7 or view.shape[0] < HEADER + cap:
        raise ValueError(f"a {view.shape[0]}-byte buffer has no {cap}-byte record area")
    base = &view[0]
    read = load_u64(base + READ_AT)
    write = load_u64(base + WRITE_AT)
    start = write % <unsigned long long>cap
    if (read > write or (read | write) & 7 or frame > cap - <long long>(write - read) or frame > cap - <long long>start
            or frame > max_frame):
        return False
    p = base + HEADER + start
    _le32(p, <uint32_t>size)
    _le32(p + 4, <uint32_t>(size ^ WRAP))
    memcpy(p + FRAME_SIZE, <const char*>lead, lsize)
    memcpy(p + FRAME_SIZE + lsize, <const char*>record, rsize)
    memset(p + FRAME_SIZE + size, 0, frame - FRAME_SIZE - size)
    store_u64(base + WSEQ_AT, load_u64(base + WSEQ_AT) + 1)
    store_u64(base + WRITE_AT, write + frame)
    return True


def find(buf, long long cap, long long read, long long write, long long cursor, long long max_count,
         int want):
    cdef const uint8_t[::1] view = buf
    return _find(_area(view, cap), cap, read, write, cursor, max_count, want)


cdef void _deliver(object buf, uint8_t[::1] view, long long cap, list starts, list ends, bytearray out,
                   list ids) except *:
    cdef Py_ssize_t i, count = len(starts)
    cdef long long pos, end, last = 0, total = 0, size
    cdef uint8_t* area
    cdef uint8_t* p
    cdef char* dst
    cdef uint32_t attempts
    cdef Py_ssize_t old
    if count == 0 or len(ends) != count:
        _pure.deliver_run(buf, starts, ends, out, ids)
        return
    for i in range(count):
        pos = starts[i]
        end = ends[i]
        if pos < last or end - pos < STATE_SIZE + MESSAGE_HEADER or end > cap:
            _pure.deliver_run(buf, starts, ends, out, ids)
            return
        last = end
        total += FRAME_SIZE + end - pos - STATE_SIZE
    area = &view[HEADER]
    for i in range(count):
        p = area + <long long>starts[i]
        attempts = ((<uint32_t>p[ATTEMPTS_AT] << 8) | p[ATTEMPTS_AT + 1]) + 1
        p[ATTEMPTS_AT] = (attempts >> 8) & 0xFF
        p[ATTEMPTS_AT + 1] = attempts & 0xFF
        p[0] = IN_FLIGHT
    old = PyByteArray_GET_SIZE(out)
    PyByteArray_Resize(out, old + total)
    dst = PyByteArray_AS_STRING(out) + old
    for i in range(count):
        pos = starts[i]
        end = ends[i]
        size = end - pos - STATE_SIZE
        _be32(<uint8_t*>dst, <uint32_t>(size + 4))
        _be32(<uint8_t*>dst + 4, 2)
        memcpy(dst + FRAME_SIZE, area + pos + STATE_SIZE, size)
        dst += FRAME_SIZE + size
        ids.append(PyBytes_FromStringAndSize(<char*>area + pos + STATE_SIZE + ID_AT, 16))


def deliver_run(buf, list starts not None, list ends not None, bytearray out not None, list ids not None):
    cdef uint8_t[::1] view = buf
    _deliver(buf, view, view.shape[0] - HEADER, starts, ends, out, ids)


def deliver_ready(buf, long long cap, long long read, long long write, long long cursor, long long max_count,
                  bytearray out not None, list ids not None):
    cdef uint8_t[::1] view = buf
    cdef list positions = []
    runs, cursor = _find(_area(view, cap), cap, read, write, cursor, max_count, READY)
    for starts, ends in runs:
        _deliver(buf, view, cap, starts, ends, out, ids)
        positions += starts
    return positions, cursor


def release_front(buf, long long cap, long long read, long long write):
    cdef const uint8_t[::1] view = buf
    cdef const uint8_t* area = _area(view, cap)
    cdef long long pos, size, check, released = 0
    while read < write:
        pos = read % cap
        if pos + FRAME_SIZE > cap:
            raise RingError(f"corrupt record frame at {pos} (past the end of the area)")
        size = _u32(area + pos)
        check = _u32(area + pos + 4)
        if size == WRAP or size ^ check != WRAP or size < STATE_SIZE:
            if size == WRAP and check == 0:  # a wrap marker: the record is at the start
                read += cap - pos
                pos = 0
                size = _u32(area)
                check = _u32(area + 4)
            if size ^ check != WRAP or size < STATE_SIZE:
                raise RingError(f"corrupt record frame at {pos} (length {size})")
        if pos + FRAME_SIZE >= cap:
            raise RingError(f"corrupt record frame at {pos} (past the end of the area)")
        if area[pos + FRAME_SIZE] != DONE:
            break
        read += FRAME_SIZE + size + (-size & 7)
        released += 1
    return read, released


cdef long long _record(const uint8_t* area, long long cap, long long cursor, long long write,
                       long long* pos) except -1:
    """The frame at index ``cursor`` (past a wrap marker): stores its area position in
    ``pos`` and returns its record size; ``*pos`` is -1 for a wrap marker (size: the skip)."""
    cdef long long size, check, frame
    pos[0] = cursor % cap
    if pos[0] + FRAME_SIZE > cap:
        raise RingError(f"corrupt record frame at {pos[0]} (past the end of the area)")
    size = _u32(area + pos[0])
    check = _u32(area + pos[0] + 4)
    if size ^ check != WRAP:
        raise RingError(f"corrupt record frame at {pos[0]} (length {size})")
    if size == WRAP:
        if write - cursor < cap - pos[0]:
            raise RingError(f"wrap marker at {pos[0]} beyond the write index")
        size = cap - pos[0]
        pos[0] = -1
        return size
    frame = FRAME_SIZE + size + (-size & 7)
    if frame > write - cursor or pos[0] + frame > cap or size < STATE_SIZE:
        raise RingError(f"record length {size} at {pos[0]} runs past the written data")
    return size


def recover_run(buf, long long cap, long long read, long long write, long long cursor, long long max_count):
    cdef uint8_t[::1] view = buf
    cdef uint8_t* area = <uint8_t*>_area(view, cap)
    cdef long long pos = 0, size, walked = 0, ready = 0, live = 0
    cdef uint8_t state
    cdef list deferred = []
    if cursor < read:
        cursor = read
    while cursor < write and walked < max_count:
        size = _record(area, cap, cursor, write, &pos)
        if pos < 0:
            cursor += size
            continue
        state = area[pos + FRAME_SIZE]
        if state == READY or state == IN_FLIGHT:
            area[pos + FRAME_SIZE] = READY
            ready += 1
            live += 1
        elif state == DEFERRED:
            deferred.append(pos + FRAME_SIZE)
            live += 1
        elif state != DONE:
            raise RingError(f"record at {pos} has unknown state {state}")
        cursor += FRAME_SIZE + size + (-size & 7)
        walked += 1
    return cursor, walked, ready, live, deferred


def live_ids(buf, long long cap, long long read, long long write, long long cursor, long long max_count,
             among, set out not None):
    cdef const uint8_t[::1] view = buf
    cdef const uint8_t* area = _area(view, cap)
    cdef long long pos = 0, size, walked = 0
    cdef bytes msg_id
    if cursor < read:
        cursor = read
    while cursor < write and walked < max_count:
        size = _record(area, cap, cursor, write, &pos)
        if pos < 0:
            cursor += size
            continue
        if size >= STATE_SIZE + ID_AT + 16 and area[pos + FRAME_SIZE] != DONE:
            msg_id = PyBytes_FromStringAndSize(<char*>area + pos + FRAME_SIZE + STATE_SIZE + ID_AT, 16)
            if among is None or msg_id in among:
                PySet_Add(out, msg_id)
        cursor += FRAME_SIZE + size + (-size & 7)
        walked += 1
    return cursor
