# Sourced by the launch scripts. reason_last COMMAND... runs a torchrun command line (torchrun ..., srun torchrun
# ...); when a rank stopped with train.py's one-line reason (a refused config, a full disk), or the run stopped on
# a signal (Ctrl-C, a scheduler's SIGTERM) with its resume line, that line is printed again after torchrun's own
# summary and traceback, so that it is the last line on screen (or in the job's log). Returns the command's status.
reason_last() {
    local record reason resume_line status child
    record=$(mktemp)
    reason=$(mktemp)
    resume_line=$(mktemp)
    # torchrun copies the failed rank's error record, which holds train.py's reason, to $record; the rank that
    # tells the reason also writes it to $reason (torchrun's record of a job it ended itself, as on a fault that
    # closes the rendezvous, holds only its own error); rank 0 writes its resume line to $resume_line. It runs in
    # the background so that this script can print after it; a background job ignores Ctrl-C unless told otherwise.
    ( trap - INT; TORCHELASTIC_ERROR_FILE="$record" TRAIN_REASON_FILE="$reason" TRAIN_RESUME_LINE_FILE="$resume_line" \
        exec "$@" ) &
    child=$!
    # A scheduler's SIGTERM to this script is a preemption: torchrun passes it on to every rank, which checkpoint.
    # Ctrl-C reaches torchrun directly (same process group): the no-op trap only keeps this script waiting for it.
    trap 'kill -TERM "$child" 2>/dev/null' TERM
    trap ':' INT
    while :; do
        status=0
        wait "$child" || status=$?
        kill -0 "$child" 2>/dev/null || break
    done
    trap - TERM INT
    # A run that stopped on a signal wrote its resume line; torchrun's record then holds only its own signal.
    if [ "$status" -ne 0 ] && [ -s "$resume_line" ]; then
        cat "$resume_line" >&2
    elif [ "$status" -ne 0 ] && [ -s "$reason" ]; then
        cat "$reason" >&2
    elif [ "$status" -ne 0 ] && [ -s "$record" ]; then
        python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["message"]["message"], file=sys.stderr)' \
            "$record" || true
    fi
    rm -f "$record" "$reason" "$resume_line"
    return "$status"
}
