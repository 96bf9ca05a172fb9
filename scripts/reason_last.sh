# Sourced by the launch scripts. reason_last COMMAND... runs a torchrun command line (torchrun ..., srun torchrun
# ...); when a rank stopped with train.py's one-line reason (a refused config, a full disk), that line is printed
# again after torchrun's own summary and traceback, so that it is the last line on screen (or in the job's log).
# Returns the command's status.
reason_last() {
    local record status=0
    record=$(mktemp)
    # torchrun copies the failed rank's error record, which holds train.py's reason, to this file.
    TORCHELASTIC_ERROR_FILE="$record" "$@" || status=$?
    if [ "$status" -ne 0 ] && [ -s "$record" ]; then
        python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["message"]["message"], file=sys.stderr)' \
            "$record" || true
    fi
    rm -f "$record"
    return "$status"
}
