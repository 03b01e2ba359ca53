#!/bin/bash
# README command 1 timed from the shell, alternating two clones (issue 50's measurement):
#
#   bash benchmarks/time_readme_demo.sh BEFORE_CLONE AFTER_CLONE [ROUNDS=3] > log
#
# For each round, in each clone in turn (BEFORE first): remove ./torchcal-demo, then
#   /usr/bin/time sh -c 'pip install -e . && torchcal demo'
# printing the commit, the start and end times with /proc/loadavg, the demo's own "Wall time"
# line and /usr/bin/time's WALL figure.  Each run's results.json is kept as
# results-<label>-<round>.json beside the log's working directory so that the runs can be
# compared byte for byte (only the "generated" stamp may differ).  Run it on idle cores.
set -u
before=$1; after=$2; rounds=${3:-3}
here=$(pwd)
for i in $(seq 1 "$rounds"); do
  for pair in "before $before" "after $after"; do
    set -- $pair
    label=$1; dir=$2
    ( cd "$dir" && rm -rf torchcal-demo
      echo "== $label-$i $(git log --oneline -1 | cut -c1-60) start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
      /usr/bin/time -f "WALL %e s user %U sys %S" sh -c 'pip install -e . && torchcal demo' 2>&1 \
        | grep -E "WALL|Wall time"
      echo "end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
      cp torchcal-demo/*/results.json "$here/results-$label-$i.json" )
  done
done
