#!/bin/bash
# Seventeenth session, issue 10: ncu76's source counters again (its CSV did not come back), listed
# per instruction (probe/ncu_inst.py), for the wide hdim-256 backward, causal s4096.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
timeout -s KILL 150 ncu --profile-from-start off --section SourceCounters --section WarpStateStats -k regex:"dq_dk_dv" \
   -o /tmp/wide256c python3 bench/probe/once.py bwd 256 4096 causal > /tmp/ncu.log 2>&1; echo "rc=$?"
timeout -s KILL 60 ncu -i /tmp/wide256c.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2> /tmp/src.err
echo "rc=$?"; python3 bench/probe/ncu_inst.py /tmp/src.csv 0.3 || tail -5 /tmp/src.err
gzip -c /tmp/src.csv > $OUT/wide256c_src.csv.gz
