#!/usr/bin/env bash
# Compiles every CUDA kernel of qwen3-cuda to PTX with NVRTC, for every architecture the runtime
# supports, and validates each PTX file with ptxas. Needs no GPU, no driver and no CUDA toolkit:
# NVIDIA's pip wheels provide libnvrtc.so (nvidia-cuda-nvrtc-cu12) and ptxas (nvidia-cuda-nvcc-cu12).
# Fails on any kernel compile error. Used by CI; see docs/cuda.md.
#
# The wheels go into a virtualenv outside the repository: $QWEN3_CUDA_VENV if set (reused when it
# already exists), otherwise a temporary directory removed at exit.
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned so CI is reproducible; 12.9 matches the `cuda-12090` bindings qwen3-cuda builds cudarc with.
NVRTC_WHEEL="nvidia-cuda-nvrtc-cu12==12.9.86"
NVCC_WHEEL="nvidia-cuda-nvcc-cu12==12.9.86"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
venv="${QWEN3_CUDA_VENV:-$tmp/venv}"

if [ ! -x "$venv/bin/python" ]; then
    echo "== installing $NVRTC_WHEEL and $NVCC_WHEEL into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check "$NVRTC_WHEEL" "$NVCC_WHEEL"
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
nvrtc_lib="$site/nvidia/cuda_nvrtc/lib"
ptxas="$site/nvidia/cuda_nvcc/bin/ptxas"
test -e "$nvrtc_lib/libnvrtc.so.12" || { echo "libnvrtc.so.12 not found in $nvrtc_lib" >&2; exit 1; }
test -x "$ptxas" || { echo "ptxas not found at $ptxas" >&2; exit 1; }

echo "== NVRTC: every kernel to PTX (cargo test -p qwen3-cuda --features cuda --test nvrtc)"
# cudarc opens libnvrtc through the dynamic loader, so the wheel's lib/ goes on LD_LIBRARY_PATH.
# The tests are #[ignore]d where libnvrtc may be missing; --include-ignored runs them here.
mkdir -p "$tmp/ptx"
LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    QWEN3_PTX_DIR="$tmp/ptx" \
    cargo test -p qwen3-cuda --features cuda --test nvrtc -- --include-ignored

echo "== ptxas: assembling each PTX file for its real architecture"
"$ptxas" --version | tail -1
n=0
for ptx in "$tmp"/ptx/*.ptx; do
    arch="${ptx##*.compute_}"
    arch="${arch%.ptx}"
    "$ptxas" -arch="sm_$arch" "$ptx" -o /dev/null
    n=$((n + 1))
done
if [ "$n" -eq 0 ]; then
    echo "no PTX was produced" >&2
    exit 1
fi
echo "ptxas: $n PTX files assembled without error"
