#!/bin/bash
# Steps 50-51, part 2: the whole GPU suite (-v: a run cut by the time limit still shows each result).
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
timeout -s KILL 575 python3 -m pytest -m gpu -v -p no:cacheprovider -n 15 tests > $OUT/suite.txt 2>&1
echo "rc=$? $(tail -1 $OUT/suite.txt)"
echo "PASSED: $(grep -c ' PASSED ' $OUT/suite.txt)  FAILED: $(grep -c ' FAILED ' $OUT/suite.txt)  ERROR: $(grep -c ' ERROR ' $OUT/suite.txt)  SKIPPED: $(grep -c ' SKIPPED ' $OUT/suite.txt)"
grep -E " FAILED | ERROR " $OUT/suite.txt | head -12; grep -E "^E  " $OUT/suite.txt | head -8
