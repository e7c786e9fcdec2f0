"""A stand-in for CuPy on the CPU, for the tests of the GPU API's host side: NumPy arrays that
answer the few CuPy attributes the API reads (device, data.ptr), a module namespace with the
CuPy functions it calls, and a ``get_function`` replacement that records every launch with its
parameter struct decoded (pointers resolved back to the fake device arrays)."""

from __future__ import annotations

import ctypes
import types

import numpy as np

from cupy_fmha import params as P

__all__ = ["FakeArray", "OtherDeviceArray", "fake_cupy", "Recorder", "decode_params"]


class _Dev:
    def __init__(self, i):
        self.id = i


class FakeArray(np.ndarray):
    """A NumPy array that answers the few CuPy attributes the API reads."""

    dev_id = 0

    @property
    def data(self):  # cupy.cuda.MemoryPointer's .ptr and copy_from_device_async
        ptr = self.__array_interface__["data"][0]
        return types.SimpleNamespace(ptr=ptr, copy_from_device_async=lambda src, n: ctypes.memmove(ptr, src.ptr, n))

    def get(self):  # cupy.ndarray.get: to the host
        return np.asarray(self)

    def copy(self, *args, **kwargs):  # a new device array: its address resolves too
        return _fake(np.ndarray.copy(self, *args, **kwargs))

    @property
    def device(self):
        return _Dev(self.dev_id)


class OtherDeviceArray(FakeArray):
    dev_id = 1


_LIVE: dict = {}  # device address -> the FakeArray at it (what a pointer field points to)


def _fake(x):
    f = x.view(FakeArray)
    if f.size:
        _LIVE[f.__array_interface__["data"][0]] = f
    return f


class FakeStream:
    """``cupy.cuda.Stream`` as far as ``cupy_fmha.jax`` uses it: made from an object with the CUDA
    stream protocol, entered as a context; ``entered`` counts the entries."""

    entered = 0

    def __init__(self, handle):
        self.ptr = handle

    @classmethod
    def from_external(cls, obj):
        version, handle = obj.__cuda_stream__()
        assert version == 0
        return cls(handle)

    def __enter__(self):
        FakeStream.entered += 1
        return self

    def __exit__(self, *exc):
        return False


def _memory_pointer(mem, offset):
    """``cupy.cuda.MemoryPointer`` over an ``UnownedMemory`` stand-in (ptr, size, owner): the host
    bytes at that address, which ``FakeArray(shape, dtype, <this>)`` (NumPy's ndarray
    constructor: shape, dtype, buffer) views without a copy."""
    ptr, size, owner = mem
    return (ctypes.c_char * max(size - offset, 1)).from_address(ptr + offset)


def fake_cupy(cc: str, hip_arch: str | None = None):
    """The stand-in module for a device of compute capability ``cc``; with ``hip_arch`` (HIP's
    ``gcnArchName``, e.g. ``"gfx942:sramecc+:xnack-"``) a cupy-rocm one, whose runtime says
    ``is_hip`` and whose ``cc`` is what CuPy reports there (e.g. "94")."""
    runtime = types.SimpleNamespace(is_hip=hip_arch is not None,
                                    getDeviceProperties=lambda i: {"gcnArchName": (hip_arch or "").encode()})
    return types.SimpleNamespace(
        ndarray=FakeArray,
        cuda=types.SimpleNamespace(Device=lambda *a: types.SimpleNamespace(id=0, compute_capability=cc), runtime=runtime,
                                   Stream=FakeStream, UnownedMemory=lambda ptr, size, owner, dev: (ptr, size, owner),
                                   MemoryPointer=_memory_pointer),
        asarray=lambda x, dtype=None: _fake(np.asarray(x, dtype=dtype)),
        ascontiguousarray=lambda x: _fake(np.ascontiguousarray(x)),
        zeros=lambda shape, dtype=np.float32: _fake(np.zeros(shape, dtype)),
        empty=lambda shape, dtype=np.float32: _fake(np.zeros(shape, dtype)),
        where=np.where, isnan=np.isnan, bool_=np.bool_,
        float16=np.float16, float32=np.float32, float64=np.float64, uint16=np.uint16, uint32=np.uint32, int32=np.int32,
    )


#: params-struct fields that hold device pointers
_POINTERS = {"ptr", "lse", "delta", "dq_acc", "dbias_acc", "dq_sem", "acc", "keep", "slopes", "cu_seqlens_q", "cu_seqlens_k"}


def decode_params(params) -> dict:
    """A kernel's parameter struct (a one-element structured array) as {name: value}, with the
    groups flattened the way the kernels' old positional arguments were named (``seq.seqlen_q``
    -> ``seqlen_q``, ``bias.kind`` -> ``bias_kind``, ``bias.ptr`` -> ``bias``) and every non-null
    pointer resolved to the fake device array it addresses."""
    assert isinstance(params, np.ndarray) and params.shape == (1,) and params.dtype.names
    out = {}

    def walk(rec, dt, prefix):
        for name in dt.names:
            sub = dt.fields[name][0]
            if sub.names:
                walk(rec[name], sub, "" if name == "seq" else f"{name}_")
                continue
            key = prefix[:-1] if name == "ptr" else prefix + name
            val = rec[name]
            if name in _POINTERS:
                val = _LIVE[int(val)] if int(val) else np.uint64(0)
            out[key] = val

    walk(params[0], params.dtype, "")
    return out


class Recorder:
    """Stands in for ``get_function``: records each launch (spec, grid, block, shared memory, the
    tensor maps' count and bytes, and ``args``: {parameter name: argument}); a hook may act as
    the kernel (here: fill the dS workspace)."""

    def __init__(self, hook=None):
        self.launches, self.hook = [], hook

    def __call__(self, spec):
        rec = self

        class Fn:
            max_dynamic_shared_size_bytes = 1 << 20

            def __call__(self, grid, block, args, shared_mem=0):
                struct = P.KERNEL_STRUCTS[spec.source]
                all_args = args
                maps = 0
                if spec.source in P.FLAT_ABI:  # the struct's fields as separate arguments (after any maps)
                    maps = len(args) - len(P.flat_names(struct))
                    args = (P.unflatten(struct, args[maps:]),)
                elif spec.source.endswith("_ws"):  # tensor maps (128-byte void arrays), then the struct
                    maps = len(args) - 1
                    assert all(a.dtype == np.dtype((np.void, 128)) for a in args[:maps]), spec.source
                    args = args[maps:]
                assert len(args) == 1, (spec.source, len(args))  # one params struct by value
                # its bytes, as an unstructured void array of the struct's size
                assert args[0].dtype.itemsize == struct.itemsize, (spec.source, args[0].dtype)
                launch = dict(spec=spec, grid=grid, block=block, smem=shared_mem, maps=maps,
                              map_bytes=tuple(bytes(np.asarray(m)) for m in all_args[:maps]),
                              args=decode_params(args[0].view(struct)))
                rec.launches.append(launch)
                if rec.hook is not None:
                    rec.hook(launch)

        return Fn()




def delta_pattern(shape) -> np.ndarray:
    """The D that :func:`delta_hook`'s stand-in dot_do_o writes: a fixed float32 pattern."""
    return (np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) % 13) - 6


def delta_hook(seen: list):
    """A :class:`Recorder` hook that acts as dot_do_o (D := :func:`delta_pattern`) and records, for
    each dq_dk_dv launch, ``{"dot": the pattern, "main": D as that launch reads it, "lse": its lse
    argument}`` in ``seen``: what the launcher did to D in between (dlse) shows as main - dot."""

    def hook(launch):
        src, args = launch["spec"].source, launch["args"]
        if src == "fmha_bwd_dot_do_o":
            d = args["delta"]
            d[...] = delta_pattern(d.shape)
        elif src.startswith("fmha_bwd_dq_dk_dv"):
            d = args["delta"]
            seen.append({"dot": delta_pattern(d.shape), "main": np.array(d), "lse": args["lse"]})

    return hook
