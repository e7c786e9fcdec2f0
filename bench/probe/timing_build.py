"""The shared part of the TIMING probes (timeline58.py, fwd_timeline.py, wide_timeline.py): after one
call through the library has compiled a kernel's TIMING build, compile the same source again as a
module of our own (CuPy gives a module's globals only to its owner), put its function in the
library's place, and read a `__device__` timeline array of that module after a call.

    mod, spec = swap_in("fmha_fwd_sm90_ws")
    rows, a = read_timeline(mod, "fmha_fwd_timeline", (1 << 14, 84), call)
"""
import cupy as cp
import numpy as np

from cupy_fmha import compile as C
from cupy_fmha.spec import backend_for


def grid_inputs(d: int, s: int, n: int):
    """(batch, nhead, n arrays): FlashAttention's grid at head dim ``d`` and seqlen ``s`` (batch * s =
    16384, nhead * d = 2048), bf16 bshd standard normals (seed 0), the inputs every TIMING probe uses."""
    import ml_dtypes

    b, h = 16384 // s, 2048 // d
    rng = np.random.default_rng(0)
    return b, h, [cp.asarray(rng.standard_normal((b, s, h, d), np.float32).astype(ml_dtypes.bfloat16)) for _ in range(n)]


def swap_in(source: str):
    """(module, spec) of the compiled instance of ``source`` (one call must have compiled it), now
    the function the library launches."""
    dev = cp.cuda.Device()
    key = next(kk for kk in C._functions if kk[0].source == source)
    spec = key[0]
    opts = C.nvrtc_options(spec, backend_for(int(dev.compute_capability)).compile_arch(spec))
    mod = cp.RawModule(code=C.load_source(spec.source), options=opts)
    C._functions[key] = mod.get_function(spec.entry)
    return mod, spec


def read_timeline(mod, name: str, shape: tuple[int, int], call, warmup: int = 3):
    """The rows of ``mod``'s global ``name`` (uint64 ``shape``) that one ``call`` wrote (first word
    nonzero), as int64, with their indices (the CTAs' linear index, blockIdx.x fastest); ``warmup``
    calls first."""
    for _ in range(warmup):
        call()
    arr = cp.ndarray(shape, cp.uint64, memptr=mod.get_global(name))
    arr.fill(0)
    cp.cuda.runtime.deviceSynchronize()
    call()
    cp.cuda.runtime.deviceSynchronize()
    a = cp.asnumpy(arr)
    rows = np.nonzero(a[:, 0] > 0)[0]
    return rows, a[rows].astype(np.int64)


def sm_mhz() -> float:
    """The SM clock the device reports (MHz; 1980 if it does not)."""
    try:
        return int(cp.cuda.Device().attributes["ClockRate"]) / 1e3  # (the attribute is kHz)
    except Exception:  # noqa: BLE001
        return 1980.0
