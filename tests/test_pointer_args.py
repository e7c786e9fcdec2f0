"""params.pointer_args: the kernel arguments as CuPy pointer objects into a per-thread staging
buffer. The bytes behind each pointer must be exactly what kernel_args would hand CuPy (the
struct's bytes by value, or each flattened field's), a second call must reuse the same pointers
with the new values, and two threads must not share a buffer. A stand-in for CuPy's CPointer
records the address; the memory is read back with ctypes."""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from cupy_fmha import params as P


class Ptr:
    def __init__(self, p=0):
        self.ptr = p


VALUES = ((1, 2, 3, 4),) * 6 + (5, 6, 7, 8, 21, -9, (10, 11, 12, 13), 64, 72, 2, 1, 0.125, 0.5, (-3, 7, 1, 0),
                                (14, 4), (15, 16, 17, 18, 19, 3, 0), (2**64 - 1, 20, 40000, 1.25))


def _other(values):
    return tuple(tuple(v + 1 if isinstance(v, int) and 0 <= v < 2**63 else v for v in x) if isinstance(x, tuple)
                 else (x + 1 if isinstance(x, int) and 0 <= x < 2**63 else x) for x in values)


def test_by_value_struct_bytes():
    (p,) = P.pointer_args(P.BWD, VALUES, False, Ptr)
    assert ctypes.string_at(p.ptr, P.BWD.itemsize) == P.pack(P.BWD, VALUES).tobytes()
    (q,) = P.pointer_args(P.BWD, _other(VALUES), False, Ptr)
    assert q is p and ctypes.string_at(p.ptr, P.BWD.itemsize) == P.pack(P.BWD, _other(VALUES)).tobytes()


def test_flat_fields_bytes():
    ptrs = P.pointer_args(P.BWD, VALUES, True, Ptr)
    scalars = P.kernel_args(P.BWD, VALUES, True)
    assert len(ptrs) == len(scalars) == len(P.flat_names(P.BWD))
    for p, s in zip(ptrs, scalars):
        assert ctypes.string_at(p.ptr, s.nbytes) == s.tobytes(), P.flat_names(P.BWD)
    again = P.pointer_args(P.BWD, _other(VALUES), True, Ptr)
    assert all(a is b for a, b in zip(again, ptrs))
    for p, s in zip(again, P.kernel_args(P.BWD, _other(VALUES), True)):
        assert ctypes.string_at(p.ptr, s.nbytes) == s.tobytes()


def test_every_struct_by_value():
    for dt in (P.FWD, P.DOT_DO_O, P.CONVERT, P.DROPOUT_MASK):
        values = tuple(np.zeros(1, dt)[0].tolist())
        (p,) = P.pointer_args(dt, values, False, Ptr)
        assert ctypes.string_at(p.ptr, dt.itemsize) == P.pack(dt, values).tobytes()


def test_threads_do_not_share_a_buffer():
    mine = P.pointer_args(P.BWD, VALUES, False, Ptr)[0].ptr  # alive while the thread makes its own
    seen = []
    t = threading.Thread(target=lambda: seen.append(P.pointer_args(P.BWD, VALUES, False, Ptr)[0].ptr))
    t.start()
    t.join()
    assert seen and seen[0] != mine
