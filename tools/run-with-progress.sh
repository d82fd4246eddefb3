#!/usr/bin/env bash
# run-with-progress.sh LABEL COMMAND...: run COMMAND, printing the elapsed time every 20 s while
# it runs and the total when it ends. A C++ extension builds for a minute or two in silence;
# `make` wraps each stage's install in this so that a long build is not taken for a hang.
label=$1; shift
start=$(date +%s)
"$@" &
pid=$!
while sleep 20; kill -0 "$pid" 2>/dev/null; do
    echo "    ... $label: $(( $(date +%s) - start )) s"
done
if wait "$pid"; then
    echo "    $label: done in $(( $(date +%s) - start )) s"
else
    status=$?
    echo "    $label: FAILED after $(( $(date +%s) - start )) s (exit $status)"
    exit "$status"
fi
