#!/usr/bin/env bash
# run-with-progress.sh LABEL COMMAND...: run COMMAND, printing the elapsed time every 20 s while
# it runs and the total when it ends. A C++ extension builds for a minute or two in silence;
# `make` wraps each stage's install in this so that a long build is not taken for a hang.
# A command that ends sooner costs nothing extra: the script waits on the command itself, and a
# separate ticker prints the progress lines until the command ends.
label=$1; shift
start=$(date +%s)
"$@" &
pid=$!
# The ticker: its sleep holds none of our output streams, so that a pipe reading `make`'s output
# (make | tee log) is not kept open by a sleep still running after the ticker is stopped.
( while sleep 20 </dev/null >/dev/null 2>&1; do
      echo "    ... $label: $(( $(date +%s) - start )) s"
  done ) &
ticker=$!
wait "$pid"
status=$?
kill "$ticker" 2>/dev/null
wait "$ticker" 2>/dev/null
if [ "$status" -eq 0 ]; then
    echo "    $label: done in $(( $(date +%s) - start )) s"
else
    echo "    $label: FAILED after $(( $(date +%s) - start )) s (exit $status)"
    exit "$status"
fi
