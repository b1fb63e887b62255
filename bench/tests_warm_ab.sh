#!/usr/bin/env bash
# The tests' warm rank server (tests/rankserver.py, issue 36) against cold ranks, side by side: each
# test file given (default: test_epochs test_numguard test_checkpoint) run warm then cold in round 1,
# cold then warm in round 2 (the machine is shared and noisy: the two modes alternate). One line per
# run: wall seconds, then user and system CPU seconds of the whole pytest tree (/usr/bin/time counts
# every reaped descendant: the rank server and the ranks it forked and reaped included) and the
# 1-minute load average before and after.
#   bash bench/tests_warm_ab.sh [test_x ...] >> results.txt
set -uo pipefail
cd "$(dirname "$0")/.."
files=("${@:-test_epochs test_numguard test_checkpoint}")
read -ra files <<<"${files[*]}"
for round in 1 2; do
  for f in "${files[@]}"; do
    if [[ $round == 1 ]]; then modes="warm cold"; else modes="cold warm"; fi
    for m in $modes; do
      if [[ $m == cold ]]; then export CLUSTERFSDP_TEST_COLD=1; else unset CLUSTERFSDP_TEST_COLD; fi
      l0=$(cut -d' ' -f1 /proc/loadavg)
      r=$({ /usr/bin/time -f "wall/user/sys %e %U %S" .venv/bin/python -m pytest -q -p no:cacheprovider "tests/$f.py" 2>&1; } |
        grep -E "passed|failed|wall/user/sys" | tr '\n' ' ')
      echo "$(date -u +%H:%M) round $round $f $m load $l0->$(cut -d' ' -f1 /proc/loadavg) $r"
    done
  done
done
