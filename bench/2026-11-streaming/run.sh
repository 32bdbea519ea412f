#!/usr/bin/env bash
# Live streams on the lent H100 against NeMo 3.0's BufferedRNNTPipeline, same checkpoint and files, one command:
#   bash bench/2026-11-streaming/run.sh [PART...]      (carry .whl.tar.xz and .nemo-site.tar.xz)
# Parts: smoke (GPU tests, one stream), parity (float32 token ids, 64 files), nemo (NeMo's RTFx in bfloat16),
# max (ours as fast as it goes), one (one stream alone at real-time pace), realtime (ours at real-time pace: latency
# per level, LEVELS=N,N,...).
set -uo pipefail
source scripts/gpu_setup.sh
[ -d /tmp/nemo-site ] || tar xJf .nemo-site.tar.xz -C /tmp
nemo() { step "$1" "$2" env PYTHONPATH=/tmp/nemo-site:/tmp/site python3 scripts/nemo_stream.py "${@:3}"; }
# NeMo with float32 as float32: TF32 off for cuDNN's convolutions too (torch's default allows it there)
nemo32() { step "$1" "$2" env PYTHONPATH=/tmp/nemo-site:/tmp/site python3 -c "import runpy, sys, torch
torch.backends.cudnn.allow_tf32 = False
sys.argv = ['nemo_stream.py', *sys.argv[1:]]
runpy.run_path('scripts/nemo_stream.py', run_name='__main__')" "${@:3}"; }
parts=${*:-smoke parity nemo max realtime}
for part in $parts; do case $part in
smoke)
    step "gpu tests" 240 python3 -m pytest -q -x tests/test_gpu.py
    step "one stream" 60 python3 -m graphscribe.cli $speech/librispeech_2086-149220-0033.wav --stream -f jsonl -m $ckpt --dtype bfloat16 ;;
parity)
    # float32 as float32: NVIDIA's config runs float32 matrix products in TF32 ("high"), which is not NeMo's float32
    nemo32 "nemo float32 64" 240 $ckpt /tmp/f512 --streams 64 --limit 64 --dtype float32 --matmul-precision highest \
        --out $OUT/nemo-f32
    step "ours float32 64" 120 python3 scripts/compare_stream.py $ckpt /tmp/f512 --streams 64 --limit 64 --dtype float32 \
        --out $OUT/ours-f32 --nemo $OUT/nemo-f32/transcripts.json
    step "ours float32 8 cpu" 300 python3 scripts/compare_stream.py $ckpt /tmp/f512 --streams 8 --limit 8 --dtype float32 \
        --device cpu --out $OUT/ours-f32-cpu --nemo $OUT/nemo-f32/transcripts.json ;;
nemo)
    nemo "nemo bfloat16 256" 240 $ckpt /tmp/f512 --streams 256 --dtype bfloat16 --out $OUT/nemo-bf16-256 ;;
max)
    util max
    step "ours bfloat16 max" 240 python3 -m graphscribe.cli bench --streams 64,256,512 --pace max --folder /tmp/f512 ${PROFILE:-} \
        -m $ckpt --dtype bfloat16 --json $OUT/ours-max.json
    unutil max ;;
one)
    step "ours bfloat16 one stream" 120 python3 -m graphscribe.cli bench --streams 1 --folder /tmp/f512 \
        -m $ckpt --dtype bfloat16 --json $OUT/ours-one.json ;;
realtime)
    util rt
    step "ours bfloat16 realtime" 400 python3 -m graphscribe.cli bench --streams ${LEVELS:-256,512,768} --folder /tmp/f512 ${PROFILE:-} \
        -m $ckpt --dtype bfloat16 --json $OUT/ours-realtime.json
    unutil rt ;;
esac; done
