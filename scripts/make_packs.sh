#!/usr/bin/env bash
# The wheels a lent GPU machine lacks, packed to carry (scripts/gpu_setup.sh unpacks them there): each wheel for
# CPython 3.12 on manylinux x86_64 unzipped into one folder, its .so files stripped, tar | xz -9e (a tenth of the
# wheels). A fresh checkout holds none of them (they are ignored), so this makes them again from the registry:
#   bash scripts/make_packs.sh [bench] [serve] [vad] [pyspy]   (bench and serve by default; writes .whl-NAME.tar.xz,
#   and .pyspy.xz: py-spy's binary alone, for the PYSPY=1 profiles of the bench/*/run.sh scripts)
# bench: what `transcribe bench --streams` and the NeMo scripts need beside the image (soundfile, pyyaml);
# serve: the serve extra without onnxruntime and silero_vad, and bench's;
# vad: those two for server VAD, carried beside serve's (8 MB: onnxruntime 1.19, the last release whose wheel is
# half the size of today's and built for NumPy 2, without its model tools, and silero-vad's one ONNX model the
# server runs; the tree, serve's and vad's come to about 63 MB of the 64 MiB a call carries).
set -euo pipefail
cd "$(dirname "$0")/.."
bench=(soundfile cffi pycparser pyyaml typing_extensions)
serve=("${bench[@]}" starlette anyio sniffio idna uvicorn h11 click httptools uvloop websockets aiohttp
    aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl)
vad=(onnxruntime==1.19.2 silero-vad flatbuffers packaging protobuf coloredlogs humanfriendly)
pip=${PIP:-.venv/bin/pip}
for name in ${*:-bench serve}; do
    work=$(mktemp -d)
    if [ $name = pyspy ]; then
        $pip download -q --no-deps --only-binary=:all: --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
            -d "$work" py-spy
        python3 -m zipfile -e "$work"/py_spy-*.whl "$work/site"
        strip --strip-unneeded "$work"/site/py_spy-*.data/scripts/py-spy
        xz -9e -c "$work"/site/py_spy-*.data/scripts/py-spy > .pyspy.xz
        echo ".pyspy.xz: $(du -h .pyspy.xz | cut -f1)"; rm -rf "$work"; continue
    fi
    declare -n wanted=$name
    $pip download -q --no-deps --only-binary=:all: --implementation cp --python-version 3.12 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$work/wheels" "${wanted[@]}"
    mkdir "$work/site"
    for wheel in "$work"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$work/site"; done
    find "$work/site" -name '*.so*' -type f -exec strip --strip-unneeded {} +
    if [ $name = vad ]; then
        rm -rf "$work"/site/onnxruntime/{transformers,quantization,tools}
        find "$work/site/silero_vad/data" -type f ! -name silero_vad_16k_op15.onnx -delete  # serve/vad.py's MODEL_FILE
    fi
    tar c -C "$work/site" . | xz -9e > .whl-$name.tar.xz
    echo ".whl-$name.tar.xz: $(du -h .whl-$name.tar.xz | cut -f1) (${wanted[*]})"
    rm -rf "$work"
done
