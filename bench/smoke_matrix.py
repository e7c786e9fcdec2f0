"""CK-style smoke matrix through the ``cupy-fmha`` CLI: every combination of

    prec (fp16, bf16) x layout (bshd, bhsd; thd in group mode) x hdim (32, 64, 128, 256)
    x bias (n, e, a; dbias with e) x p_drop (0, 0.2) x mask (0, t, b, t:l,r, b:l,r)
    x mode (batch, group)

for ``fwd`` and ``bwd``, each run verified against the float64 reference (``valid: y`` is the
pass mark). Runs in one process (Typer's test runner), small shapes that are not tile multiples,
GQA 2 in half of the runs. Prints a summary table and writes JSON. A combination the CLI refuses
(usage error, exit 2) is counted as unsupported and fails the run; every combination is supported
now (group mode takes an elementwise bias of [1, 1, max_seqlen_q, max_seqlen_k], and dropout).
Last full run on the H200: 1680/1680 valid in 92 s (bench/results/2026-11-29-h200-smoke-matrix.json).

    python bench/smoke_matrix.py                 # the whole matrix on the GPU (~1400 runs)
    python bench/smoke_matrix.py --quick         # one layout, hdim 64/128, masks 0/b/t:l,r
    python bench/smoke_matrix.py --backend numpy --quick   # the matrix logic, on the CPU
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

MASKS = ("0", "t", "b", "t:40,20", "b:30,45")


def matrix(quick: bool = False, p_drops=(0.0, 0.2)):
    """Yield (command, options dict) for every point of the matrix."""
    precs = ("fp16", "bf16")
    hdims = (64, 128) if quick else (32, 64, 128, 256)
    masks = ("0", "b", "t:40,20") if quick else MASKS
    biases = (("n", False), ("e", False), ("e", True), ("a", False))
    for prec, hdim, (bias, dbias), p_drop, mask, mode in itertools.product(
        precs, hdims, biases, p_drops, masks, ("batch", "group")
    ):
        layouts = ("thd",) if mode == "group" else (("bshd",) if quick else ("bshd", "bhsd"))
        for layout in layouts:
            for cmd in ("fwd", "bwd"):
                if cmd == "fwd" and dbias:
                    continue  # dbias is a backward output
                yield cmd, dict(prec=prec, layout=layout, hdim=hdim, bias=bias, dbias=dbias,
                                p_drop=p_drop, mask=mask, mode=mode)


def cli_args(cmd: str, o: dict, backend: str, index: int) -> list[str]:
    """The ``cupy-fmha`` argument list for one matrix point."""
    gqa = index % 2 == 1
    args = [cmd, "--dtype", o["prec"], "--hdim", str(o["hdim"]), "--nhead", "4",
            "--nhead-k", "2" if gqa else "4", "--mask", o["mask"], "--bias", o["bias"],
            "--seed", str(index), "--warmup", "0", "--repeat", "1", "--json", "--backend", backend]
    if o["mode"] == "group":
        args += ["--mode", "group", "--seqlen-q", "100,37,0,130", "--seqlen-k", "80,61,50,130"]
    else:
        args += ["--layout", o["layout"], "--batch", "2", "--seqlen-q", "130", "--seqlen-k", "97"]
    if o["dbias"]:
        args += ["--dbias"]
    if o["p_drop"]:
        args += ["--p-drop", str(o["p_drop"]), "--drop-seed", str(1000 + index), "--drop-offset", str(index)]
    return args


def main(
    quick: Annotated[bool, typer.Option(help="Small subset (one batch layout, hdim 64/128, 3 masks).")] = False,
    backend: Annotated[str, typer.Option(help="cupy or numpy.")] = "cupy",
    limit: Annotated[int, typer.Option(help="Stop after this many runs (0 = all).")] = 0,
    out_dir: Annotated[Path, typer.Option(help="Where the JSON goes.")] = HERE / "results",
    name: Annotated[str, typer.Option(help="JSON file stem.")] = "smoke-matrix",
    p_drops: Annotated[str, typer.Option(help="Comma list of dropout probabilities.")] = "0,0.2",
) -> None:
    from rich.console import Console
    from rich.table import Table
    from typer.testing import CliRunner

    from cli.app import app

    con = Console()
    runner = CliRunner()
    records = []
    t0 = time.perf_counter()
    drops = tuple(float(x) for x in p_drops.split(","))
    for index, (cmd, o) in enumerate(matrix(quick, drops)):
        if limit and index >= limit:
            break
        args = cli_args(cmd, o, backend, index)
        res = runner.invoke(app, args)
        rec = dict(cmd=cmd, **o, args=" ".join(args), exit_code=res.exit_code)
        if res.exit_code == 2:  # the CLI refused the combination (a usage error): not supported
            rec.update(valid=False, unsupported=True, error=(res.stderr or res.stdout)[-300:])
            records.append(rec)
            continue
        try:
            out = json.loads(res.stdout.strip().splitlines()[-1])
            rec["valid"] = bool(out.get("valid"))
            rec["tflops"] = out.get("tflops")
            if not rec["valid"]:
                rec["error"] = json.dumps(out.get("checks"))
        except (ValueError, IndexError, AttributeError):
            rec["valid"] = False
            rec["error"] = (res.stdout + (res.stderr if res.stderr_bytes else ""))[-400:]
        records.append(rec)
        if not rec["valid"]:
            con.print(f"[red]INVALID[/] cupy-fmha {rec['args']}\n{rec.get('error', res.stdout[-400:])}",
                      markup=False)
        elif index % 100 == 0:
            con.print(f"[{index}] ok  {cmd} {o}")
    elapsed = time.perf_counter() - t0

    tab = Table(title=f"smoke matrix ({backend}): valid / runs")
    for col in ("cmd", "mode", "bias", "p_drop", "valid", "unsupported", "runs"):
        tab.add_column(col)
    groups: dict = {}
    for r in records:
        key = (r["cmd"], r["mode"], r["bias"] + ("+dbias" if r["dbias"] else ""), r["p_drop"])
        v, u, n = groups.get(key, (0, 0, 0))
        groups[key] = (v + r["valid"], u + bool(r.get("unsupported")), n + 1)
    for key, (v, u, n) in sorted(groups.items()):
        tab.add_row(*(str(x) for x in key), str(v), str(u), str(n), style=None if v == n else "red")
    con.print(tab)
    nvalid = sum(r["valid"] for r in records)
    nuns = sum(bool(r.get("unsupported")) for r in records)
    con.print(f"{nvalid}/{len(records)} runs valid, {nuns} refused as unsupported, "
              f"{len(records) - nvalid - nuns} invalid, in {elapsed:.0f} s")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(dict(backend=backend, quick=quick, p_drops=drops, elapsed_s=elapsed,
                                    valid=nvalid, unsupported=nuns, runs=len(records), records=records),
                               indent=1))
    con.print(f"wrote {path}")
    raise typer.Exit(0 if nvalid == len(records) else 1)


if __name__ == "__main__":
    os.environ.setdefault("COLUMNS", "200")
    typer.run(main)
