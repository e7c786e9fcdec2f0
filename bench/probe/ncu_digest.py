"""Digest of `ncu --csv --page raw` output (one row per kernel): time, issue activity, pipe
utilization and the stall reasons per issued instruction, largest first.

    python bench/probe/ncu_digest.py ncu.csv
"""
import csv
import sys

rows = list(csv.reader(open(sys.argv[1], errors="replace")))
start = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
head, units, data = rows[start], rows[start + 1], rows[start + 2:]


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return None


for r in data:
    m = dict(zip(head, r))
    print("==", m.get("Kernel Name", "?")[:90])
    for key in ("gpu__time_duration.sum", "launch__registers_per_thread", "launch__grid_size", "launch__block_size",
                "sm__warps_active.avg.pct_of_peak_sustained_active", "smsp__issue_active.avg.pct_of_peak_sustained_active",
                "smsp__inst_executed.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed"):
        if key in m:
            print(f"   {key} = {m[key]}")
    pipes = sorted(((num(v) or 0, k) for k, v in m.items() if "pipe" in k and k.endswith("pct_of_peak_sustained_active")), reverse=True)
    print("   pipes:", ", ".join(f"{k.split('__')[1].replace('.avg.pct_of_peak_sustained_active', '')} {v:.1f}" for v, k in pipes[:12] if v > 0.5))
    st = sorted(((num(v) or 0, k) for k, v in m.items() if "issue_stalled" in k and k.endswith("per_issue_active.ratio")), reverse=True)
    print("   stalls/issue:", ", ".join(f"{k.split('stalled_')[1].split('_per')[0]} {v:.2f}" for v, k in st[:10] if v > 0.01))
    extra = [k for k in m if any(w in k for w in ("gmma", "data_bank", "pipe_xu.sum", "mem_shared.sum", "cycles_elapsed.avg",
                                                   "smsp__cycles_active.avg", "dram__throughput.avg.pct", "pipe_uniform.sum",
                                                   "launch__shared_mem_per_block", "launch__grid_size", "lts__throughput.avg.pct",
                                                   "lts__t_bytes.sum.per_second", "gpc__cycles_elapsed.avg.per_second"))]
    for key in sorted(set(extra)):
        print(f"   {key} = {m[key]}")
