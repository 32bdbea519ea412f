#!/usr/bin/env bash
# Train the demo model on the lent GPU in one continuous run longer than one command may last (10 minutes):
# the run starts in its own process session and later commands, on the same warm machine, wait for it.
#   bash scripts/gpu_demo_run.sh start [train_demo.py options]   # copy the tree aside, launch, return at once
#   bash scripts/gpu_demo_run.sh wait AGE      # until the run is AGE seconds old (or over); log + latest snapshot -> $OUT
#   bash scripts/gpu_demo_run.sh finish LIMIT  # until the run ends (at most LIMIT seconds); log, eval.json, demo.nemo -> $OUT
# Carry .whl (or .demo-whl), .espeak/debs, .espeak/libpcaudio.so.0 and .textdata with `start`.
# The session that trained the bundled model (the options are train_demo.py's defaults, spelled out):
#   start --train-seconds 1380 --utterances 250000 --deadline 1560; wait 570; wait 1150; finish 470
set -uo pipefail
RUN=/tmp/demo-run
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"

copy_log() {
    cp "$RUN/train.log" "$OUT/train.log" 2>/dev/null
    tail -n 4 "$RUN/train.log" 2>/dev/null
}

case "${1:-}" in
start)
    shift
    rm -rf "$RUN" && mkdir -p "$RUN"
    cp -a . "$RUN/tree"  # later commands re-sync the repo: the run reads only its own copy
    cd "$RUN/tree" || exit 1
    if ! python3 -c 'import soundfile' 2>/dev/null; then  # the GPU machine's Python lacks it: carried wheels
        wheels=$(ls .whl/*.whl 2>/dev/null || ls .demo-whl/*.whl)
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $wheels || exit 1
    fi
    date +%s >"$RUN/started"
    setsid nohup bash -c 'PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 python3 scripts/train_demo.py \
        --out "$0/out" --work "$0/work" "$@"; echo $? >"$0/rc"' "$RUN" "$@" >"$RUN/train.log" 2>&1 </dev/null &
    sleep 20
    copy_log
    ;;
wait)
    age=$2
    started=$(cat "$RUN/started") || exit 1
    while [ ! -e "$RUN/rc" ] && [ $(($(date +%s) - started)) -lt "$age" ]; do sleep 5; done
    copy_log
    if [ -e "$RUN/work/snapshot.nemo" ]; then  # a run cut short still leaves this model (16 MiB parts)
        split -b 15M -d -a 1 "$RUN/work/snapshot.nemo" "$OUT/snapshot.nemo.part"
        sha256sum "$RUN/work/snapshot.nemo" | tee "$OUT/snapshot.sha256"
    fi
    ;;
finish)
    limit=$2
    end=$(($(date +%s) + limit))
    while [ ! -e "$RUN/rc" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    copy_log
    cp "$RUN"/out/* "$OUT"/ 2>/dev/null
    echo "train_demo.py exit: $(cat "$RUN/rc" 2>/dev/null || echo 'still running')"
    ;;
*)
    echo "usage: $0 start [options] | wait AGE | finish LIMIT" >&2
    exit 2
    ;;
esac
