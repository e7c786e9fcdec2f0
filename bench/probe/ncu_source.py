"""Per-opcode digest of `ncu -i REP --page source --csv --print-source sass`: instructions executed
and warp-stall samples by opcode, largest first (bench/NOTES.md step 48).

    python bench/probe/ncu_source.py source.csv [top]
"""
import csv
import re
import sys
from collections import defaultdict

rows = list(csv.reader(open(sys.argv[1], errors="replace")))
top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
hi = next(i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r))
head = [c.strip() for c in rows[hi]]
print("columns:", "; ".join(head)[:600])
src = head.index("Source")
def col(pat):
    return next((i for i, c in enumerate(head) if re.search(pat, c)), None)
ie = col(r"^Instructions Executed$") or col(r"Instructions Executed")
ss = col(r"Warp Stall Sampling \(All") or col(r"Sampling")
agg = defaultdict(lambda: [0.0, 0.0])
tot = [0.0, 0.0]
for r in rows[hi + 1:]:
    if len(r) <= max(src, ie or 0, ss or 0):
        continue
    text = r[src].strip()
    m = re.match(r"(@!?U?P\w+\s+)?([A-Z0-9_.]+)", text)
    if not m:
        continue
    op = m.group(2).split(".")[0]
    for k, c in enumerate((ie, ss)):
        if c is not None:
            try:
                v = float(r[c].replace(",", "") or 0)
            except ValueError:
                v = 0.0
            agg[op][k] += v
            tot[k] += v
print(f"total instructions {tot[0]:.4g}, stall samples {tot[1]:.4g}")
for op, (n, s) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
    print(f"  {op:12s} inst {n / max(tot[0], 1) * 100:5.1f}%  samples {s / max(tot[1], 1) * 100:5.1f}%")
