"""Compile kernel instances into CuPy's on-disk cache in parallel, before a GPU run whose tests
would otherwise compile them one by one (each pytest-xdist worker, each variant): one process per
CPU, each building its share through ``cupy_fmha.compile.get_function`` (the library's own
options, so the cache keys match what the tests and benchmarks ask for later).

    python bench/probe/precompile.py --fwd-ws-variants "SWIZZLE=1" "SWIZZLE=1,PV_OVERLAP=1"

Instances: for fp16 and bf16, the head dims of tests/test_gpu_fwd_ws.py (32 ... 128), with and
without ALiBi, on this device: the forward (the default choice and, at padded head dims 64/128,
the warp-specialized forward under each ``CUPY_FMHA_FWD_WS_TILES`` value given) and the
backward's kernels (and the ws backward under each ``--bwd-ws-variants`` value). Prints the count and the time taken.

``--only-fwd-ws --hdims 64,128 --dtypes bf16``: just the warp-specialized forward under each variant (and its
short-diagonal build; ``--features``: its ALiBi, dropout and bias builds too), for an A/B of variants
(bench/probe/fwd_variants.py) or their tests, whose first point would otherwise compile every variant
one after the other inside its time limit."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

HDIMS = (32, 40, 56, 64, 72, 96, 104, 120, 128)


def _specs(variants: list[str], bwd_variants: tuple[str, ...] = ()) -> list:
    from cupy_fmha.backends import cuda

    cc = 90
    seen: dict = {}
    for dtype in ("fp16", "bf16"):
        for d in HDIMS:
            for alibi in (False, True):
                specs = [cuda.fwd_spec(dtype, d, d, cc, alibi=alibi), cuda.fwd_spec(dtype, d, d, cc, alibi=alibi, short=True),
                         *vars(cuda.bwd_specs(dtype, d, d, cc, alibi=alibi)).values()]
                if cuda.use_sm90(d, d, cc):
                    for v in variants:
                        os.environ["CUPY_FMHA_FWD_WS_TILES"] = v
                        specs.append(cuda.fwd_ws_spec(dtype, d, d, alibi=alibi))
                    os.environ.pop("CUPY_FMHA_FWD_WS_TILES", None)
                    for v in bwd_variants:  # the ws backward under each CUPY_FMHA_BWD_WS_TILES value
                        os.environ["CUPY_FMHA_BWD_WS_TILES"] = v
                        specs.append(cuda.bwd_ws_spec(dtype, d, d, alibi=alibi))
                    os.environ.pop("CUPY_FMHA_BWD_WS_TILES", None)
                for s in specs:
                    seen.setdefault(s.name, s)
    return list(seen.values())


def _fwd_ws_specs(variants: list[str], hdims, dtypes, features: bool = False) -> list:
    from cupy_fmha.backends import cuda

    seen: dict = {}
    for v in variants:
        os.environ["CUPY_FMHA_FWD_WS_TILES"] = v
        for dtype in dtypes:
            for d in hdims:
                kinds = [dict(short=False), dict(short=True)]
                if features:  # ALiBi, dropout, and the TMA bias build at 64 and 128
                    kinds += [dict(alibi=True), dict(dropout=True), *([dict(bias_tma=2)] if d <= 128 else [])]
                for kw in kinds:
                    s = cuda.fwd_ws_spec(dtype, d, d, **kw)
                    seen.setdefault(s.name, s)
    os.environ.pop("CUPY_FMHA_FWD_WS_TILES", None)
    return list(seen.values())


def _build(spec) -> str:
    from cupy_fmha.compile import get_function

    get_function(spec)
    return spec.name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fwd-ws-variants", nargs="*", default=[""], help="CUPY_FMHA_FWD_WS_TILES values")
    ap.add_argument("--bwd-ws-variants", nargs="*", default=[], help="CUPY_FMHA_BWD_WS_TILES values")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--only-fwd-ws", action="store_true", help="only the ws forward under each --fwd-ws-variants value")
    ap.add_argument("--hdims", default="64,128,256", help="with --only-fwd-ws: comma-separated head dims")
    ap.add_argument("--dtypes", default="bf16,fp16", help="with --only-fwd-ws: comma-separated dtypes")
    ap.add_argument("--features", action="store_true", help="with --only-fwd-ws: the ALiBi, dropout and bias builds too")
    args = ap.parse_args()
    if args.only_fwd_ws:
        specs = _fwd_ws_specs(args.fwd_ws_variants, [int(x) for x in args.hdims.split(",")], args.dtypes.split(","),
                              args.features)
    else:
        specs = _specs(args.fwd_ws_variants, tuple(args.bwd_ws_variants))
    t0 = time.perf_counter()
    failed = 0
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
        futures = [ex.submit(_build, s) for s in specs]
        for s, f in zip(specs, futures):
            try:
                f.result()
            except Exception as exc:  # noqa: BLE001 - report and go on; the tests will show it again
                failed += 1
                print(f"FAILED {s.name}: {str(exc)[:2000]}", flush=True)
    print(f"precompiled {len(specs) - failed} of {len(specs)} instances in {time.perf_counter() - t0:.1f} s "
          f"({args.jobs} processes)", flush=True)


if __name__ == "__main__":
    main()
