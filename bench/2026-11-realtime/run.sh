#!/usr/bin/env bash
# /v1/realtime on the lent H100: WebSocket sessions of a running `transcribe serve` against the same engine's live
# streams in process (the streaming issue's capacity), same checkpoint and files, one command:
#   bash bench/2026-11-realtime/run.sh [PART...]      (carry .whl-serve.tar.xz, and .whl-vad.tar.xz for server VAD)
# The packs: scripts/make_packs.sh serve vad. TURNS=commit needs no VAD and runs with .whl-serve.tar.xz alone.
# Parts: inproc (live streams in process at real-time pace, LEVELS), sessions (the server's sessions at real-time
# pace, SESSIONS, TURNS=vad: server VAD, or commit: one turn a session, the in-process streams' audio), one (one
# session on an idle server, the 7.4 s clip, five times; TURNS as above). CKPT and PRESET: another checkpoint (a
# cache-aware one: CKPT=/tmp/nemotron.nemo PRESET=nemotron-speech-streaming-en-0.6b; the server runs its own chunk).
set -uo pipefail
GS_LAZY=1 source scripts/gpu_setup.sh
checkpoint ${PRESET:-parakeet-tdt-0.6b-v3} $ckpt
case " ${*:-inproc} " in *" inproc "*|*" sessions "*) folder /tmp/f512 512 ;; esac
mkdir -p /tmp/clip74; for k in 1 2 3 4 5; do cp $speech/librispeech_2086-149220-0033.wav /tmp/clip74/c$k.wav; done
parts=${*:-inproc sessions one}
for part in $parts; do case $part in
inproc)
    step "in process bfloat16 realtime" 300 python3 -m graphscribe.cli bench --streams ${LEVELS:-512,640} \
        --folder /tmp/f512 -m $ckpt --dtype bfloat16 --json $OUT/inproc.json ;;
sessions)
    EXTRA="--max-sessions 2048 --http-workers ${WORKERS:-8}" serve sessions bfloat16
    util ws
    # the busiest threads halfway through the last level, the server's and the clients'
    (sleep ${TOP_AT:-60}; top -b -H -n 2 -d 3 -w 160 | awk "/^top -/{n++} n==2" | head -40 > $OUT/top.txt) &
    # PYSPY=1 (carry .pyspy.xz, py-spy xz-packed): the engine's threads sampled for PYSPY_S (15) seconds from TOP_AT, then 8 s of the GIL holder
    if [ -n "${PYSPY:-}" ]; then
        [ -x /tmp/py-spy ] || xz -dc .pyspy.xz > /tmp/py-spy && chmod +x /tmp/py-spy
        (sleep ${TOP_AT:-60}; /tmp/py-spy record --pid $server -d ${PYSPY_S:-15} -r 200 -f raw --threads -o $OUT/engine.txt \
            > $OUT/pyspy.log 2>&1; /tmp/py-spy record --pid $server -d 8 -r 200 -f raw --gil -o $OUT/engine-gil.txt \
            >> $OUT/pyspy.log 2>&1) &
    fi
    step "sessions bfloat16" 400 python3 -m graphscribe.cli bench --realtime ws://127.0.0.1:8000 --folder /tmp/f512 \
        --sessions ${SESSIONS:-64,512} --client-processes ${CLIENTS:-8} --turns ${TURNS:-vad} \
        --json $OUT/sessions-${TURNS:-vad}.json
    unutil ws
    grep -E "^graphscribe_live_step_(rows_(sum|count)|seconds_total)" <(curl -s localhost:8000/metrics) | tee -a $log
    stop sessions ;;
one)
    serve one bfloat16
    step "one session" 120 python3 -m graphscribe.cli bench --realtime ws://127.0.0.1:8000 --folder /tmp/clip74 \
        --sessions 1,1,1,1,1 --turns ${TURNS:-vad} --json $OUT/one.json
    stop one ;;
esac; done
