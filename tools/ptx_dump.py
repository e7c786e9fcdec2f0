"""The PTX of every CUDA kernel instance (the dispatch table and the experimental table, sm_80 and
sm_90a), for showing that a source change leaves the CUDA build unchanged (bench/NOTES.md steps
24-25): dump a tree before and after the change, then compare.

    PYTHONPATH=<tree> python tools/ptx_dump.py dump OUTDIR [NPROC [PREFIX]]   # one .ptx per instance/arch
    python tools/ptx_dump.py compare DIR_A DIR_B                     # lists the pairs that differ

Each pair is compiled with NVRTC alone (no GPU: the options of cupy_fmha.compile.offline_compile
without ptxas's), and comment lines are dropped (NVRTC's header names its build). <tree> is a
checkout (or a copy of its cupy_fmha/ and kernels/) whose kernels are used: cupy_fmha.compile
reads kernels/ beside the package it is imported from. A dump skips pairs already in OUTDIR;
PREFIX keeps only the instances whose names start with it (one source's, e.g. ``fmha_fwd_sm90_ws_``).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor


def _specs():
    from cupy_fmha.backends.cuda import experimental_table
    from cupy_fmha.spec import default_dispatch_table

    return {s.name: s for s in default_dispatch_table() + experimental_table()}


def _job(args):
    name, arch, out = args
    from cupy.cuda import nvrtc

    from cupy_fmha import compile as C

    spec = _specs()[name]
    prog = nvrtc.createProgram(C.load_source(spec.source), f"{name}.cu", [], [])
    try:
        nvrtc.compileProgram(prog, [*C.nvrtc_options(spec, arch), *C._nvrtc_include_dirs()])
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    if isinstance(ptx, bytes):
        ptx = ptx.decode()
    lines = [line for line in ptx.splitlines() if not line.lstrip().startswith("//")]
    with open(os.path.join(out, f"{name}.{arch}.ptx"), "w") as f:
        f.write("\n".join(lines) + "\n")


def dump(out: str, nproc: int, prefix: str = "") -> None:
    os.makedirs(out, exist_ok=True)
    jobs = [(name, arch, out) for name, s in _specs().items() for arch in ("sm_80", "sm_90a")
            if name.startswith(prefix) and not (s.target == "sm90a" and arch != "sm_90a") and not os.path.exists(os.path.join(out, f"{name}.{arch}.ptx"))]
    print(f"{len(jobs)} instance/arch pairs to compile", flush=True)
    with ProcessPoolExecutor(nproc, mp_context=multiprocessing.get_context("spawn")) as ex:
        for i, _ in enumerate(ex.map(_job, jobs), 1):
            if i % 50 == 0:
                print(i, flush=True)


def compare(a: str, b: str) -> int:
    names_a, names_b = set(os.listdir(a)), set(os.listdir(b))
    differ = [n for n in sorted(names_a & names_b)
              if open(os.path.join(a, n), "rb").read() != open(os.path.join(b, n), "rb").read()]
    for n in differ:
        print("differs:", n)
    for n in sorted(names_a ^ names_b):
        print("only in one:", n)
    same = len(names_a & names_b) - len(differ)
    print(f"{same} of {len(names_a | names_b)} identical")
    return 0 if not differ and names_a == names_b else 1


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "dump":
        dump(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else os.cpu_count() or 1,
             sys.argv[4] if len(sys.argv) > 4 else "")
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
