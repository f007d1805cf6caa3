#!/usr/bin/env bash
# count.sh — a checkpointable ebbtide job in bash, using only the environment contract.
#
# Needs bash 5 ($EPOCHREALTIME).  Submit it with:
#
#     ebb qsub -N count-sh -- bash examples/count.sh 1000 0.1 10
#
# Arguments: N (count to, default 100), STEP_S (seconds per step, default 0.05),
# EVERY (steps between checkpoints, default 10).
#
# What it shows: a job needs no ebbtide library to be evicted cleanly.  It
#   * traps $EBBTIDE_WARNING_SIGNAL (TERM by default) and only sets a flag;
#   * keeps its count in $EBBTIDE_CHECKPOINT_DIR/count.txt, written to a temporary file,
#     synced and renamed, so a kill never damages the previous checkpoint;
#   * appends a {"type": "checkpoint", ...} line to $EBBTIDE_STATUS_FILE after each one;
#   * resumes from $EBBTIDE_RESUME_FROM (locally: from its own count.txt);
#   * on the warning checkpoints and exits 99: "checkpointed, requeue me".
set -euo pipefail
export LC_ALL=C  # a dot as decimal point in $EPOCHREALTIME and awk

n=${1:-100}
step_s=${2:-0.05}
every=${3:-10}

dir=${EBBTIDE_CHECKPOINT_DIR:-./.ebbtide-checkpoints}
mkdir -p "$dir"
ckpt="$(cd "$dir" && pwd)/count.txt"

warned=0
trap 'warned=1' "${EBBTIDE_WARNING_SIGNAL:-TERM}"

count=0
if [[ -n "${EBBTIDE_RESUME_FROM:-}" ]]; then
    count=$(<"$EBBTIDE_RESUME_FROM")
elif [[ -f "$ckpt" ]]; then
    count=$(<"$ckpt")
fi
echo "attempt ${EBBTIDE_ATTEMPT:-1}: starting at $count of $n"

checkpoint() {
    local started=$EPOCHREALTIME tmp="$ckpt.tmp.$$"
    printf '%d\n' "$count" >"$tmp"
    sync "$tmp" 2>/dev/null || sync
    mv -f "$tmp" "$ckpt"
    sync "$(dirname "$ckpt")" 2>/dev/null || true
    if [[ -n "${EBBTIDE_STATUS_FILE:-}" ]]; then
        local now=$EPOCHREALTIME size
        size=$(wc -c <"$ckpt")
        printf '{"type": "checkpoint", "path": "%s", "size_bytes": %d, "duration_s": %s, "time": %s}\n' \
            "$ckpt" "$size" "$(awk -v a="$started" -v b="$now" 'BEGIN { printf "%.6f", b - a }')" \
            "$now" >>"$EBBTIDE_STATUS_FILE"
    fi
}

while ((count < n)); do
    sleep "$step_s" || true  # the warning reaches every process: a sleep may end early
    count=$((count + 1))
    saved=0
    if ((count % every == 0)); then
        checkpoint
        saved=1
    fi
    if ((warned && count < n)); then
        ((saved)) || checkpoint
        echo "warned at $count: checkpointed, requeueing"
        exit 99
    fi
done
echo "counted to $count"
