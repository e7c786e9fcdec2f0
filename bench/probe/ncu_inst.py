"""Per-instruction listing of `ncu -i REP --page source --csv --print-source sass`: in address order,
every instruction that holds at least MIN percent of the warp-stall samples, with its executions,
and the running share of the samples (bench/NOTES.md step 75).

    python bench/probe/ncu_inst.py source.csv [MIN]
"""
import csv
import sys

rows = list(csv.reader(open(sys.argv[1], errors="replace")))
lim = float(sys.argv[2]) if len(sys.argv) > 2 else 0.25
hi = next(i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r))
head = [c.strip() for c in rows[hi]]
src, addr = head.index("Source"), head.index("Address")
ie = head.index("Instructions Executed")
ss = next(i for i, c in enumerate(head) if c.startswith("Warp Stall Sampling (All"))


def num(x):
    try:
        return float(x.replace(",", "") or 0)
    except ValueError:
        return 0.0


body = [r for r in rows[hi + 1:] if len(r) > max(src, ie, ss)]
tot = sum(num(r[ss]) for r in body) or 1.0
run = 0.0
for n, r in enumerate(body):
    s = num(r[ss])
    run += s
    if s / tot * 100 >= lim:
        print(f"{n:5d} {r[addr].strip():>8s} {s / tot * 100:5.1f}% cum {run / tot * 100:5.1f}%  ex {num(r[ie]):9.3g}  {r[src].strip()[:90]}")
