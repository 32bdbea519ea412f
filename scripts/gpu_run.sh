#!/usr/bin/env bash
# The GPU session in one command (run on the lent H100 from the repo root, with .whl and .whl-nemo carried):
#   bash scripts/gpu_run.sh                                  # all parts; logs and JSON under $OUT (or ./gpu-out)
#   bash scripts/gpu_run.sh checkpoint compare bench           # some parts
# Parts: checkpoint (a calibrated parakeet-tdt-0.6b-v3-shaped checkpoint), compare (decoding against NeMo 3.0 on
# the same checkpoint and clips), tests / gputests (the GPU tests), bench (graphs on/off, float32 and bfloat16),
# profile (the step), tune (tiles, windows), coldstart, folder (512 files: CLI and API against NeMo's transcribe()),
# throughput (seconds per stage), shortfiles (host memory on 10 000 files), long (10 to 180 minutes), profilecli
# (cProfile of the CLI on the folder), shapes (host cost of a new batch shape), newshapes (the same per stage,
# with remedies), trace (GPU idle gaps, warm folder),
# abcli (A/B of host-side choices on the folder CLI), l2 (the step's weights kept in L2), encgraphs (the encoder's
# layers replayed from one captured layer, against the eager loop), pyspy (the folder CLI's threads sampled by
# py-spy, carried as a wheel in .whl), encprofile (the encoder's GPU time by kernel kind, float32 products
# through cuBLAS against Triton tf32x3), timeline (when the folder CLI's summary comes, when its process ends),
# jointbench (the one-row joint kernel alone, by variant), encab (another version's encoder against src/: float32
# bits, bfloat16 distance, GPU time), enckernels (the encoder's fused kernels alone, by tile configuration),
# decodeab (another version's decode against src/: time outside the steps, by phase), api (the in-memory API on
# the folder, graphs on and off), firstuses (what a process's first folder pass pays over its second, by stage).
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
log="$OUT/run.log"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
if [ -d .whl-nemo ]; then  # NeMo, for the comparison; not our huggingface_hub: transformers there pins an older one
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/nemo-site .whl-nemo/*.whl \
        .whl/soundfile*.whl .whl/cffi*.whl .whl/pycparser*.whl
fi
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
ckpt=/tmp/v3.nemo
speech=src/graphscribe/data

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log everything
    local name=$1 limit=$2
    shift 2
    echo "=== $name: $*" | tee -a "$log"
    local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$log"
    echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$log"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'; } | tee -a "$log"
run_checkpoint() {
    step checkpoint 150 python3 scripts/make_checkpoint.py parakeet-tdt-0.6b-v3 $ckpt \
        --calibrate $speech/librispeech_2086-149220-0033.wav --check $speech/jfk_44k1_stereo_24bit.flac
}
run_compare() {  # NEMO_TF32=--nemo-tf32: NeMo with PyTorch's default TF32 convolutions; ROUND_SHARES: "0.7,1.0"
    local tag=float32${NEMO_TF32:+-nemo-tf32}
    step "compare with NeMo" 150 python3 scripts/compare_nemo.py --model $ckpt --nemo-path /tmp/nemo-site \
        --dtype float32 --batch-sizes 1,8 --reps 5 --out /tmp/compare ${NEMO_TF32:-} \
        ${ROUND_SHARES:+--round-shares $ROUND_SHARES}
    cp /tmp/compare/compare.md "$OUT/compare-nemo-$tag.md"
    cp /tmp/compare/nemo.json "$OUT/nemo-$tag.json"
    cp /tmp/compare/graphscribe.json "$OUT/compare-graphscribe-$tag.json"
}
run_tests() {
    step "gpu tests" 240 env GRAPHSCRIBE_TEST_V3=$ckpt python3 -m pytest -q -m gpu tests/test_gpu.py
}
run_bench() {
    for dtype in float32 bfloat16; do
        step "bench $dtype" 120 python3 -m graphscribe.cli bench --model $ckpt --dtype $dtype --reps 5 \
            --batch-sizes 1,8 --json "$OUT/bench-$dtype.json"
    done
}
run_profile() {
    local dtype batch kind flag  # PROFILES: "dtype batch step [--no-pdl];..."
    echo "${PROFILES:-float32 1 fused;float32 1 fused --no-pdl;bfloat16 1 fused;bfloat16 1 fused --no-pdl;float32 8 fused}" |
    tr ';' '\n' | while read -r dtype batch kind flag; do
        step "profile $dtype B=$batch $kind $flag" 90 python3 scripts/profile_step.py --model $ckpt --dtype $dtype \
            --batch $batch --step $kind $flag --json "$OUT/profile.jsonl"
    done
}
run_gputests() {  # every GPU-marked test (decoding, pipeline, bench, timestamps)
    step "gpu tests (all)" 300 env GRAPHSCRIBE_TEST_V3=$ckpt python3 -m pytest -q -m gpu tests/
}
run_coldstart() {  # COLDSTART_CACHED=1: only the runs with a bytecode cache
    [ -n "${COLDSTART_CACHED:-}" ] ||
        step "cold start" 200 python3 scripts/cold_start.py --model $ckpt --reps 3 --json "$OUT/cold_start.json"
    step "cold start, bytecode cached" 200 python3 scripts/cold_start.py --model $ckpt --reps 3 \
        --pycache-prefix /tmp/pycache --json "$OUT/cold_start-pycache.json"
}
folder=/tmp/folder${FOLDER_FILES:+-$FOLDER_FILES}  # FOLDER_FILES: another number of files than 512
make_folder() {
    [ -d $folder ] || step "folder" 300 python3 scripts/make_folder.py $folder --files ${FOLDER_FILES:-512} --seed 0
}
run_folder() {  # our CLI and API against NeMo's transcribe() on 512 files (FOLDER_DTYPES: float32 at 8 and 32, bfloat16
               # at 128; FOLDER_GRAPHS: our modes in turn, default on,off)
    make_folder
    for dtype in ${FOLDER_DTYPES:-float32 bfloat16}; do
        local sizes=8,32 limit=330
        [ "$dtype" = bfloat16 ] && sizes=128 limit=240
        limit=${FOLDER_LIMIT:-$limit}  # seconds for one dtype
        step "folder $dtype" $limit python3 scripts/compare_folder.py --folder $folder --model $ckpt \
            --nemo-path /tmp/nemo-site --batch-sizes $sizes --dtypes $dtype --graphs "${FOLDER_GRAPHS:-on,off}" \
            --out "$OUT/folder-$dtype"
    done
}
run_throughput() {  # seconds per stage, graphs on and off (THROUGHPUT_DTYPES: bfloat16 at 128, float32 at
    make_folder       # THROUGHPUT_SIZES, default 8,32)
    for dtype in ${THROUGHPUT_DTYPES:-bfloat16 float32}; do
        local sizes=${THROUGHPUT_SIZES:-8,32}
        [ "$dtype" = bfloat16 ] && sizes=128
        step "throughput $dtype" 200 python3 -m graphscribe.cli bench --folder $folder --model $ckpt \
            --dtype $dtype --batch-sizes $sizes --json "$OUT/throughput-$dtype.json"
    done
}
run_shortfiles() {  # host memory on 10 000 short files
    step "short files" 120 python3 scripts/make_folder.py /tmp/short --files 10000 --short
    step "10 000 short files" 200 python3 -c "import resource, subprocess, sys; subprocess.run(sys.argv[1:]); \
print('peak RSS of the CLI: %.0f MB' % (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024))" \
        python3 -m graphscribe.cli /tmp/short --model $ckpt --dtype bfloat16 --batch 128 -o /tmp/short-out
}
run_long() {  # 10 to 180 minutes, each dtype in a process of its own (peaks hold one model), then the encoder alone
    step "long audio bfloat16" 170 python3 scripts/long_audio_bench.py --model $ckpt --out "$OUT/long-bfloat16" \
        --dtypes bfloat16 --minutes 10,30,60,180 --skip-encoder --budget-seconds 150
    step "long audio float32" 120 python3 scripts/long_audio_bench.py --model $ckpt --out "$OUT/long-float32" \
        --dtypes float32 --minutes 10,30,60 --skip-encoder --budget-seconds 100
    step "encoder alone" 90 python3 scripts/long_audio_bench.py --model $ckpt --out "$OUT/encoder" \
        --dtypes bfloat16,float32 --batch-sizes 1,8,32 --skip-long --budget-seconds 200
}
run_longcheck() {  # where a 3-hour local-attention transcript goes wrong, if it does
    step "long local check" 200 python3 scripts/long_local_check.py --model $ckpt --dtype bfloat16 --minutes 180
}
run_longbf16() {
    step "long audio bfloat16" 200 python3 scripts/long_audio_bench.py --model $ckpt --out "$OUT/long-bfloat16" \
        --dtypes bfloat16 --minutes 10,30,60,180 --skip-encoder --budget-seconds 110
}
run_longfloat32() {
    step "long audio float32" 150 python3 scripts/long_audio_bench.py --model $ckpt --out "$OUT/long-float32" \
        --dtypes float32 --minutes 10,30,60 --skip-encoder --budget-seconds 130
}
run_profilecli() {  # where the CLI's time goes, one process each: cProfile of the main thread (PROFILE_RUNS: "dtype batch;...")
    make_folder
    local dtype batch
    echo "${PROFILE_RUNS:-bfloat16 128;float32 8}" | tr ';' '\n' | while read -r dtype batch; do
        step "CLI $dtype B=$batch (unprofiled; fills Triton's cache)" 120 python3 -m graphscribe.cli $folder \
            --model $ckpt --dtype $dtype --batch "$batch" -o "/tmp/profile-out-$dtype-$batch"
        # main(), not the command's entry(): that one leaves by os._exit, before cProfile could write its file
        step "cprofile CLI $dtype B=$batch" 120 python3 -c "import cProfile, sys; from graphscribe.cli import main
profile = cProfile.Profile(); profile.enable()
try: main(sys.argv[2:])
except SystemExit: pass
profile.disable(); profile.dump_stats(sys.argv[1])" "$OUT/cli-$dtype-$batch.prof" \
            $folder --model $ckpt --dtype $dtype --batch "$batch" -o "/tmp/profile-out-$dtype-$batch"
        python3 -c "import pstats, sys; s = pstats.Stats(sys.argv[1]); s.sort_stats('cumulative').print_stats(45); \
s.sort_stats('tottime').print_stats(30)" "$OUT/cli-$dtype-$batch.prof" > "$OUT/cli-$dtype-$batch.txt" 2>&1
    done
}
run_shapes() {  # what a batch of a new shape costs the host (SHAPES: "dtype batch;...")
    local dtype batch
    echo "${SHAPES:-bfloat16 128;float32 8}" | tr ';' '\n' | while read -r dtype batch; do
        step "shape costs $dtype B=$batch" 150 python3 scripts/shape_costs.py --model $ckpt --dtype $dtype \
            --batch "$batch" --json "$OUT/shapes-$dtype-$batch.json"
    done
}
run_newshapes() {  # a new batch shape's cost per stage, and the remedies (NEW_SHAPES: "dtype batch;...")
    step "new shapes" 420 python3 scripts/new_shapes.py --model $ckpt --configs "${NEW_SHAPES:-bfloat16 128;float32 8}" \
        ${NEW_SHAPE_VARIANTS:+--variants $NEW_SHAPE_VARIANTS} --json "$OUT/new_shapes.json" --md "$OUT/new_shapes.md"
}
run_trace() {  # where the GPU waits in a warm folder pass (TRACES: "dtype batch;..."; TRACE_COLD=1: the first pass,
    make_folder  # after one CLI run has filled Triton's cache; TRACE_COLD=empty: on the cache as it is)
    local dtype batch
    echo "${TRACES:-bfloat16 128}" | tr ';' '\n' | while read -r dtype batch; do
        [ "${TRACE_COLD:-}" = 1 ] && python3 -m graphscribe.cli $folder --model $ckpt --dtype $dtype --batch "$batch" \
            -o /tmp/trace-out >/dev/null 2>&1  # Triton's kernel cache
        step "trace $dtype B=$batch" 150 python3 scripts/trace_pipeline.py --model $ckpt --folder $folder \
            --dtype $dtype --batch "$batch" --out "$OUT/trace-$dtype-$batch${TRACE_COLD:+-cold}" ${TRACE_COLD:+--cold}
    done
}
run_firstuses() {  # what the first pass pays over a second in one process, by stage and batch (FIRST_USES:
    make_folder      # "dtype batch;..."; FIRST_USES_ARGS: more first_uses.py options, e.g. --cprofile 1)
    local dtype batch
    echo "${FIRST_USES:-float32 8;float32 32;bfloat16 128}" | tr ';' '\n' | while read -r dtype batch; do
        python3 -m graphscribe.cli $folder --model $ckpt --dtype $dtype --batch "$batch" -o /tmp/fu-out \
            >/dev/null 2>&1  # Triton's kernel cache
        step "first uses $dtype B=$batch" 150 python3 scripts/first_uses.py --model $ckpt --folder $folder \
            --dtype $dtype --batch "$batch" --json "$OUT/first_uses.jsonl" ${FIRST_USES_ARGS:-}
    done
}
run_abcli() {  # A/B of host-side choices on the folder CLI, alternating (ABCLI: "dtype batch;..."; AB_REPS)
    make_folder
    local dtype batch rep variant
    declare -A start=(  # AB_VARIANTS: which of these, in turn
        [base]="from graphscribe.cli import entry; entry()"
        [cudnn-sdpa]="import graphscribe.encoder as e; from torch.nn.attention import SDPBackend as B; \
e._CUDA_BIAS_BACKENDS = [B.CUDNN_ATTENTION, B.EFFICIENT_ATTENTION, B.MATH]; from graphscribe.cli import entry; entry()"
        [cudnn-sub]="import graphscribe.encoder as e; e.Subsampling._convs = lambda self, x, n: self._conv_stack(x.unsqueeze(1), n); \
from graphscribe.cli import entry; entry()"
        [share-1]="import graphscribe.decoding as d; d.ROUND_SHARE = 1.0; from graphscribe.cli import entry; entry()"
        [no-cudnn-sdpa]="import torch; torch.backends.cuda.enable_cudnn_sdp(False); from graphscribe.cli import main; main()"
        [readers-4]="import graphscribe.pipeline as p; p.MAX_READERS = 4; from graphscribe.cli import main; main()"
        [switch-1ms]="import sys; sys.setswitchinterval(0.001); from graphscribe.cli import main; main()"
        [readers-16]="import graphscribe.pipeline as p; p.MAX_READERS = 16; from graphscribe.cli import main; main()"
        [json]="import sys; sys.argv += ['-f', 'json']; from graphscribe.cli import entry; entry()"
        [with-timings]="import graphscribe.cli as c, graphscribe.pipeline as p; o = p.transcribe_stream; \
c.transcribe_stream = lambda m, r, clock=None, timings=True: o(m, r, clock, True); c.entry()"
        [layers-all]="import graphscribe.graphs as g; g.LayerGraphs.MAX_FRAMES = {4: 768, 2: 1 << 30}; \
from graphscribe.cli import entry; entry()"
        [layers-all-json]="import sys, graphscribe.graphs as g; g.LayerGraphs.MAX_FRAMES = {4: 768, 2: 1 << 30}; \
sys.argv += ['-f', 'json']; from graphscribe.cli import entry; entry()"
        [baseline]="import sys; sys.path.insert(0, '${BASELINE_SRC:-baseline}'); from graphscribe.cli import entry; entry()"
        [pad-0.64]="import graphscribe.pipeline as p; p.PAD_SECONDS = 0.64; from graphscribe.cli import entry; entry()"
        [pad-1.28]="import graphscribe.pipeline as p; p.PAD_SECONDS = 1.28; from graphscribe.cli import entry; entry()"
        [pad-1.28-layers]="import graphscribe.pipeline as p, graphscribe.graphs as g; p.PAD_SECONDS = 1.28; \
g.LayerGraphs.MAX_FRAMES = {4: 4096, 2: 6144}; from graphscribe.cli import entry; entry()"
        [late-reads]="import graphscribe.cli as c; o = c.load_or_exit; \
c.load_or_exit = lambda *a: (lambda l: (a[-1](l.cfg, l.device, l.dtype), l)[1])(o(*a[:-1])); c.main()"
        [no-pin]="import graphscribe.pipeline as p; p.Reader.__init__ = (lambda o: lambda self, *a, **k: (o(self, *a, **k), \
setattr(self, 'pin', False))[0])(p.Reader.__init__); from graphscribe.cli import main; main()"
    )
    echo "${ABCLI:-bfloat16 128;float32 32}" | tr ';' '\n' | while read -r dtype batch; do
        python3 -m graphscribe.cli $folder --model $ckpt --dtype $dtype --batch "$batch" -o /tmp/ab-out \
            >/dev/null 2>&1  # Triton's kernel cache
        for rep in $(seq "${AB_REPS:-3}"); do
            for variant in ${AB_VARIANTS:-base no-cudnn-sdpa readers-16 no-pin}; do
                local t0=$(date +%s.%N) line
                line=$(python3 -c "${start[$variant]}" $folder --model $ckpt --dtype $dtype --batch "$batch" \
                    -o "/tmp/ab-out" 2>&1 | grep 'loaded in')
                echo "ab $dtype B=$batch $variant rep $rep: $line; process $(awk "BEGIN {printf \"%.2f\", $(date +%s.%N) - $t0}") s" | tee -a "$log"
            done
        done
    done
}
run_api() {  # the in-memory API on the folder, graphs on and off, in this run (API_CONFIGS: "dtype batch;...";
            # API_GRAPHS: the modes in turn, default on,off)
    make_folder
    local dtype batch
    echo "${API_CONFIGS:-bfloat16 128}" | tr ';' '\n' | while read -r dtype batch; do
        step "api $dtype B=$batch" 300 python3 scripts/compare_folder.py --folder $folder --model $ckpt --parts api \
            --batch-sizes "$batch" --dtypes "$dtype" --graphs "${API_GRAPHS:-on,off}" --out "$OUT/api-$dtype-$batch"
    done
}
run_timeline() {  # when the folder CLI's summary comes and when its process ends: base through cli.main() and
    make_folder     # Python's teardown, fast-exit through os._exit as `transcribe` (cli.entry) (TIMELINE, TIMELINE_REPS)
    local dtype batch rep variant
    declare -A start=(
        [base]="from graphscribe.cli import main; main()"
        [fast-exit]="import os, sys
from graphscribe.cli import main
try:
    main()
except SystemExit as done:
    sys.stdout.flush(); sys.stderr.flush(); os._exit(done.code if isinstance(done.code, int) else 0)"
    )
    echo "${TIMELINE:-float32 8;bfloat16 128}" | tr ';' '\n' | while read -r dtype batch; do
        python3 -m graphscribe.cli $folder --model $ckpt --dtype $dtype --batch "$batch" -o /tmp/tl-out \
            >/dev/null 2>&1  # Triton's kernel cache
        for rep in $(seq "${TIMELINE_REPS:-3}"); do
            for variant in base fast-exit; do
                python3 scripts/cli_timeline.py --label "$dtype B=$batch $variant" --json "$OUT/timeline.jsonl" -- \
                    python3 -c "${start[$variant]}" $folder --model $ckpt --dtype $dtype --batch "$batch" \
                    -o /tmp/tl-out 2>&1 | tee -a "$log"
            done
        done
    done
}
run_l2() {  # the step's weights kept in L2 (access policy windows), against none
    step "l2 window" 240 python3 scripts/l2_window.py --model $ckpt --json "$OUT/l2-window.json"
}
run_pyspy() {  # where the CLI's threads spend the folder job, idle time included (PYSPY_RUNS: "dtype batch;...")
    make_folder
    local dtype batch
    echo "${PYSPY_RUNS:-float32 8;bfloat16 128}" | tr ';' '\n' | while read -r dtype batch; do
        step "CLI $dtype B=$batch (fills Triton's cache)" 120 python3 -m graphscribe.cli $folder \
            --model $ckpt --dtype $dtype --batch "$batch" -o "/tmp/pyspy-out-$dtype-$batch"
        step "py-spy CLI $dtype B=$batch" 120 /tmp/site/bin/py-spy record --idle --threads --nonblocking --rate 250 \
            --format speedscope -o "/tmp/pyspy-$dtype-$batch.json" -- python3 -m graphscribe.cli $folder \
            --model $ckpt --dtype $dtype --batch "$batch" -o "/tmp/pyspy-out-$dtype-$batch"
        python3 scripts/pyspy_timeline.py "/tmp/pyspy-$dtype-$batch.json" --md "$OUT/timeline-$dtype-$batch.md" \
            >/dev/null 2>>"$log"
        gzip -c "/tmp/pyspy-$dtype-$batch.json" >"$OUT/pyspy-$dtype-$batch.json.gz"
        [ -n "${PYSPY_GIL:-}" ] || continue  # PYSPY_GIL=1: again, sampling only the thread that holds the GIL
        step "py-spy --gil CLI $dtype B=$batch" 120 /tmp/site/bin/py-spy record --gil --threads --nonblocking \
            --rate 250 --format speedscope -o "/tmp/pyspy-gil-$dtype-$batch.json" -- python3 -m graphscribe.cli \
            $folder --model $ckpt --dtype $dtype --batch "$batch" -o "/tmp/pyspy-out-$dtype-$batch"
        python3 scripts/pyspy_timeline.py "/tmp/pyspy-gil-$dtype-$batch.json" \
            --md "$OUT/timeline-gil-$dtype-$batch.md" >/dev/null 2>>"$log"
    done
}
run_encgraphs() {
    step "encoder layer graphs" 200 python3 scripts/encoder_graphs.py --model $ckpt --json "$OUT/encoder-graphs.json"
}
run_encprofile() {  # the encoder's GPU time by kernel kind; float32 products: cuBLAS against Triton tf32x3
    step "encoder profile" 240 python3 scripts/encoder_profile.py --model $ckpt ${ENC_CONFIGS:+--configs "$ENC_CONFIGS"} ${ENC_ARGS:-} \
        --json "$OUT/encoder-profile.json" --md "$OUT/encoder-profile.md"
}
run_encab() {  # another version's encoder (BASELINE_SRC: a folder holding its graphscribe package) against src/:
    local base=${BASELINE_SRC:-baseline}  # float32 bits, bfloat16 distance, GPU time (ENC_ROUNDS alternating rounds)
    step "encoder outputs, $base" 150 env PYTHONPATH=/tmp/site:$PWD/$base python3 scripts/encoder_ab.py save \
        --model $ckpt --out /tmp/enc-base.pt
    step "encoder outputs, src" 150 python3 scripts/encoder_ab.py save --model $ckpt --out /tmp/enc-src.pt
    step "encoder outputs compared (a: $base, b: src)" 60 python3 scripts/encoder_ab.py compare /tmp/enc-base.pt \
        /tmp/enc-src.pt
    for round in $(seq 1 "${ENC_ROUNDS:-1}"); do
        step "encoder profile, $base, round $round" 240 env PYTHONPATH=/tmp/site:$PWD/$base python3 \
            scripts/encoder_profile.py --model $ckpt ${ENC_CONFIGS:+--configs "$ENC_CONFIGS"} --no-gemm \
            --json "$OUT/encoder-profile-base-$round.json" --md "$OUT/encoder-profile-base-$round.md"
        step "encoder profile, src, round $round" 240 python3 scripts/encoder_profile.py --model $ckpt \
            ${ENC_CONFIGS:+--configs "$ENC_CONFIGS"} --no-gemm --json "$OUT/encoder-profile-src-$round.json" \
            --md "$OUT/encoder-profile-src-$round.md"
    done
}
run_enckernels() {  # the encoder's fused 16-bit kernels alone, by tile configuration (bfloat16, B=128 x 10 s)
    step "encoder kernels" 120 python3 scripts/encoder_kernels_bench.py --json "$OUT/encoder-kernels.json"
}
run_jointbench() {  # the one-row joint kernel alone: valid rows, the has-work check, cold weights, k and stages
    step "joint bench" 200 python3 scripts/joint_bench.py --json "$OUT/joint-bench.json"
}
run_decodeab() {  # another version (BASELINE_SRC, as encab) against src/: a decode's time outside its steps,
    local base=${BASELINE_SRC:-baseline}  # DECODE_ROUNDS alternating rounds; DECODE_ARGS: more decode_overhead.py
    # options; DECODE_OPS=1: src's host time by PyTorch operation too
    for round in $(seq 1 "${DECODE_ROUNDS:-2}"); do
        step "decode overhead, $base, round $round" 200 env PYTHONPATH=/tmp/site:$PWD/$base python3 \
            scripts/decode_overhead.py --model $ckpt --label "$base-$round" --json "$OUT/decode-overhead.jsonl" \
            --md "$OUT/decode-overhead-base-$round.md" ${DECODE_ARGS:-}
        step "decode overhead, src, round $round" 200 python3 scripts/decode_overhead.py --model $ckpt \
            --label "src-$round" --json "$OUT/decode-overhead.jsonl" --md "$OUT/decode-overhead-src-$round.md" \
            ${DECODE_OPS:+--ops "$OUT/decode-ops-src-$round.md"} ${DECODE_ARGS:-}
    done
}
run_tune() {  # TUNE_ARGS: more tune_step.py options; TUNE_SECONDS: its time limit
    step "tune" "${TUNE_SECONDS:-330}" python3 scripts/tune_step.py --model $ckpt --out "$OUT" ${TUNE_ARGS:-}
}

for what in "${@:-checkpoint compare tests bench profile tune}"; do
    for part in $what; do "run_$part"; done
done
# the device tool brings back 8 files at most: everything but the log in one archive
(cd "$OUT" && tar czf all.tgz --exclude=all.tgz --exclude=run.log . 2>/dev/null)
