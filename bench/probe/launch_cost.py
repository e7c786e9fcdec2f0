"""Host cost of kernel launches through CuPy (bench/NOTES.md step 23): (1) an empty kernel with
one int, and with four 128-byte by-value params (the ws kernels' tensor maps) passed as
one-element void NumPy arrays or pre-wrapped in CuPy's CNumpyArray; (2) the minimum time inside
CuPy's ``fn(...)`` (argument conversion + driver launch) per kernel of ``attention_backward``,
with ``CUPY_FMHA_BWD_WS=0`` and ``=1``. Needs a GPU.

    python bench/probe/launch_cost.py
"""
import os, time, collections, numpy as np, cupy as cp
src = r'''
struct __align__(64) M { unsigned char b[128]; };
extern "C" __global__ void k0(int x) {}
extern "C" __global__ void k4(const __grid_constant__ M a, const __grid_constant__ M b,
                              const __grid_constant__ M c, const __grid_constant__ M d, int x) {}
'''
mod = cp.RawModule(code=src, options=("-std=c++17",))
k0, k4 = mod.get_function("k0"), mod.get_function("k4")
maps = [np.zeros(1, np.dtype((np.void, 128))) for _ in range(4)]
try:
    from cupy.cuda.function import CNumpyArray
    wrapped = [CNumpyArray(m) for m in maps]
except Exception as e:
    print("no CNumpyArray:", e); wrapped = None
def bench(f, n=20, r=200):
    best = 1e9
    for _ in range(r):
        t0 = time.perf_counter()
        for _ in range(n): f()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
        cp.cuda.Device().synchronize()
    return best
one = np.int32(1)
print(f"k0(int)             {bench(lambda: k0((1,), (32,), (one,))):.2f} us")
print(f"k4(4 ndarray, int)  {bench(lambda: k4((1,), (32,), (*maps, one))):.2f} us")
if wrapped: print(f"k4(4 wrapped, int)  {bench(lambda: k4((1,), (32,), (*wrapped, one))):.2f} us")
import cupy_fmha
from cupy_fmha import api
acc = collections.defaultdict(list)
orig = api.get_function
class Timed:
    def __init__(self, fn, name): self.fn, self.name = fn, name
    @property
    def max_dynamic_shared_size_bytes(self): return self.fn.max_dynamic_shared_size_bytes
    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, v): self.fn.max_dynamic_shared_size_bytes = v
    def __call__(self, *a, **k):
        t0 = time.perf_counter(); self.fn(*a, **k); acc[self.name].append(time.perf_counter() - t0)
api.get_function = lambda spec: Timed(orig(spec), spec.source)
for d in (64, 128):
    q = cp.random.standard_normal((16, 1024, 16, d), dtype=cp.float32).astype(cp.float16)
    o, lse = cupy_fmha.attention_forward(q, q, q)
    for ws in ("0", "1"):
        os.environ["CUPY_FMHA_BWD_WS"] = ws
        f = lambda: cupy_fmha.attention_backward(q, q, q, q, o, lse)
        for _ in range(5): f()
        cp.cuda.Device().synchronize(); acc.clear()
        t = bench(f, 10, 60)
        print(f"d{d} ws={ws}: host {t:.1f} us/call; inside fn() min us: " +
              ", ".join(f"{k} {1e6*min(v):.1f}" for k, v in acc.items()))
