#!/usr/bin/env bash
# The GPU path, measured (issue 13): run from a fresh checkout on a machine with an NVIDIA GPU.
#
#   bash bench/gpu.sh [python -m bench.gpu options, e.g. --seconds 4 --output docs/benchmarks.md]
#
# 1. Refuses at once (exit 2) without a GPU: nvidia-smi must exist and list one.
# 2. Creates or refreshes a venv (.cache/gpu-venv; GPU_VENV overrides it) and installs the
#    serving side and onnxruntime-gpu as docker/Dockerfile.gpu does: the package with
#    --constraint docker/constraints.txt, the CPU onnxruntime removed, then
#    onnxruntime-gpu[cuda,cudnn] at the constraints file's pin; plus nvidia-ml-py (the GPU
#    metrics), onnx (bench/gpu_models.py builds the policies) and psutil (bench/servers.py).
#    No torch. The CUDA and cuDNN libraries of the nvidia wheels go on LD_LIBRARY_PATH, as
#    the image's /etc/ld.so.conf.d/rlserve-cuda.conf lists them.
# 3. Runs python -m bench.gpu (see its --help): the fallback check, the answer check against
#    onnxruntime on the CPU, rows/s and P99 at 1 to 64 rows per request with NVML utilisation
#    from /metrics and /health, written into docs/benchmarks.md's "GPU path" section.
#
# About 2-4 minutes of installing (the CUDA and cuDNN wheels are large; a second run reuses
# the venv) and 2 minutes of measuring. Needs Python 3.11 or newer (onnxruntime-gpu 1.31) and
# an NVIDIA driver of the R580 branch or newer (CUDA 13; see docker/README.md).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi --list-gpus 2>/dev/null | grep -q '^GPU '; then
    echo "bench/gpu.sh: no NVIDIA GPU: nvidia-smi is missing or lists no GPU; this script" \
        "measures the CUDA path; run it on a GPU machine" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2

python=""
for candidate in "${PYTHON:-}" python3.12 python3.13 python3.11 python3; do
    if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 \
        && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        python="$candidate"
        break
    fi
done
if [ -z "$python" ]; then
    echo "bench/gpu.sh: needs Python 3.11 or newer (onnxruntime-gpu 1.31); set PYTHON" >&2
    exit 2
fi

venv="${GPU_VENV:-.cache/gpu-venv}"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet)
constraints=(--constraint docker/constraints.txt)

echo "bench/gpu.sh: installing the serving side and onnxruntime-gpu into $venv" >&2
"${pip[@]}" install "${constraints[@]}" -e .
# As the image does: onnxruntime-gpu replaces onnxruntime (both ship the onnxruntime module).
# On a refreshed venv the serving install may have put the CPU wheel back over the GPU one's
# files: then remove it and reinstall the GPU wheel's files.
if "$venv/bin/python" -m pip show onnxruntime >/dev/null 2>&1; then
    "${pip[@]}" uninstall --yes onnxruntime
    "${pip[@]}" install "${constraints[@]}" --force-reinstall --no-deps onnxruntime-gpu
fi
"${pip[@]}" install "${constraints[@]}" "onnxruntime-gpu[cuda,cudnn]" nvidia-ml-py onnx psutil

site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
export LD_LIBRARY_PATH="$site/nvidia/cu13/lib:$site/nvidia/cudnn/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$venv/bin/python" -c 'import onnxruntime as o; print("bench/gpu.sh: onnxruntime", o.__version__, o.get_available_providers())' >&2

exec "$venv/bin/python" -m bench.gpu "$@"
