#!/usr/bin/env bash
# The GPU check kit's run step (scripts/gpu_check/prepare.sh DIR copies this to DIR/run.sh): on a
# machine with an NVIDIA GPU, its driver, NVRTC (CUDA toolkit or pip wheel) and python3 with
# torch and transformers; no Rust toolchain, no network. In order:
#   1. the device line (nvidia-smi), the driver and CUDA versions, which libnvrtc is used;
#   2. qwen3-cuda's tests: every kernel against its CPU reference, the forward pass on the GPU
#      against the references and the CPU backend, the references against transformers;
#   3. `qwen3 generate --device cuda -t 0` against the CPU's f32 greedy tokens on the fixtures;
#   4. a random checkpoint of Qwen3-0.6B's shape, made here, exported as bf16, q8 and q4, and
#      `qwen3 bench --device cuda` on each: prefill and decode tok/s, and decode's bytes a token
#      against the device's copy bandwidth (with a CPU run beside it, for scale).
# Everything goes to stdout, and with $OUT set also to $OUT/gpu_check.log, with a summary in
# $OUT/summary.txt and each benchmark's JSON in $OUT/bench-*.json. Exit status 0 when every step
# passed. Without an NVIDIA driver: one line saying so, exit status 3.
set -uo pipefail
kit=$(cd "$(dirname "$0")" && pwd)

# 0. The driver, before anything else.
if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L > /dev/null 2>&1; then
    if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
        echo "no NVIDIA driver found (no working nvidia-smi, no libcuda.so.1 for the loader): the GPU check needs a machine with an NVIDIA GPU and its driver" >&2
        exit 3
    fi
fi

# The tokenizers, which prepare.sh gzipped to keep the kit small, unpacked in place (after the
# driver check: a kit tried on a machine without a GPU stays small enough to carry).
if ! find "$kit/fixtures/models" -name tokenizer.json.gz -exec gunzip -f {} +; then
    echo "the kit's tokenizers could not be unpacked (gunzip failed)" >&2
    exit 1
fi

out=${OUT:-}
work=${QWEN3_GPU_CHECK_WORK:-${TMPDIR:-/tmp}/qwen3-gpu-check}
rm -rf "$work" && mkdir -p "$work"
. "$kit/kit_run.sh"
if [ -n "$out" ]; then kit_log "$out/gpu_check.log"; fi
finish() { kit_exit "$1"; }
summary=()
failed=0
note() { summary+=("$1"); echo "-- $1"; }

step "1. the machine"
cat "$kit/KIT"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap,clocks.max.memory --format=csv,noheader
cuda_line=$(nvidia-smi | grep -o 'CUDA Version: [0-9.]*' | head -1)
gpu=$(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | head -1)
note "device: $gpu, driver's $cuda_line; kernel $(uname -r); $(nproc) CPUs"
command -v nvcc > /dev/null && nvcc --version | tail -2

# libnvrtc: cudarc (CUDA 12.9 bindings) asks the loader for libnvrtc.so, then libnvrtc.so.12 and
# older versioned names. A CUDA 13 toolkit's dev symlink (libnvrtc.so) is found on its lib64 path;
# where only libnvrtc.so.13 exists (the cu13 pip wheel), a libnvrtc.so link to it is made in the
# work folder. The library's own folder goes on the path too: NVRTC dlopens its builtins from it.
nvrtc=""
for d in ${CUDA_HOME:-/usr/local/cuda}/lib64 /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(ldconfig -p 2>/dev/null | grep -o '/[^ ]*/libnvrtc\.so[.0-9]*$' | xargs -r -n1 dirname) \
         $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null | xargs -r -n1 printf '%s/nvidia/cu13/lib %s/nvidia/cuda_nvrtc/lib\n'); do
    for f in "$d"/libnvrtc.so "$d"/libnvrtc.so.1[0-9]; do
        if [ -e "$f" ]; then nvrtc=$f; break 2; fi
    done
done
if [ -z "$nvrtc" ]; then
    note "FAIL: no libnvrtc found (CUDA toolkit or the nvidia-cuda-nvrtc wheel): the kernels cannot be compiled"
    failed=1
else
    mkdir -p "$work/lib"
    ln -sf "$(readlink -f "$nvrtc")" "$work/lib/libnvrtc.so"
    export LD_LIBRARY_PATH="$work/lib:$(dirname "$(readlink -f "$nvrtc")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    note "NVRTC: $(readlink -f "$nvrtc")"
fi

step "2. qwen3-cuda's tests on the GPU"
# The tests that need a GPU or libnvrtc are #[ignore]d (reported as ignored where there is none);
# --include-ignored runs them here, where a missing GPU is a failure.
export QWEN3_FIXTURES_DIR="$kit/fixtures/models"
export RUST_BACKTRACE=1
for t in "$kit"/tests/*; do
    name=$(basename "$t")
    echo "-- $name"
    (cd "$work" && timeout 300 "$t" --include-ignored --test-threads 4 2>&1) | tee "$work/test-$name.log"
    rc=${PIPESTATUS[0]}
    counts=$(grep -o 'test result: .*' "$work/test-$name.log" | tail -1)
    if [ "$rc" -ne 0 ]; then
        note "FAIL tests/$name (exit $rc): ${counts:-no result line}"
        failed=1
    else
        note "PASS tests/$name: ${counts#test result: }"
    fi
done

step "3. greedy tokens: --device cuda against the CPU's f32, on the fixtures"
if python3 "$kit/greedy.py" "$kit/bin/qwen3" "$kit/fixtures/models" "$work/greedy" --device cuda | tee "$work/greedy.log"; then
    note "PASS greedy: $(grep -c '^PASS' "$work/greedy.log") fixtures, GPU tokens = CPU f32 tokens"
else
    note "FAIL greedy: $(grep '^FAIL' "$work/greedy.log" | cut -d: -f1 | cut -c6- | tr '\n' ' ')(greedy.log says how)"
    failed=1
fi

step "4. speed on Qwen3-0.6B's shape (random weights, made here)"
ckpt="$work/qwen3-0.6b"
if ! python3 "$kit/make_bench_model.py" --shape 0.6b "$ckpt" --qwen3-tokenizer "$kit/fixtures/models/tiny-qwen3-fullvocab"; then
    note "FAIL: the 0.6B checkpoint could not be made (python3 with torch is needed)"
    failed=1
else
    for dtype in bf16 q8 q4; do
        model="$work/qwen3-0.6b-$dtype.bin"
        if ! "$kit/bin/qwen3" export "$ckpt" "$model" --dtype "$dtype" > "$work/export-$dtype.log" 2>&1; then
            tail -3 "$work/export-$dtype.log"
            note "FAIL export $dtype"
            failed=1
            continue
        fi
        json="$work/bench-$dtype.json"
        if "$kit/bin/qwen3" bench "$model" --device cuda --prompt-tokens 128 -n 128 -r 5 --json > "$json"; then
            [ -n "$out" ] && cp "$json" "$out/"
            "$kit/bin/qwen3" bench "$model" --device cuda --prompt-tokens 512 -n 256 -r 3
            note "bench $dtype: $(python3 -c '
import json, sys
b = json.load(open(sys.argv[1])); r = b["runs"][0]
print("%.0f MB a token; prefill %.0f tok/s, decode %.1f tok/s = %.0f%% of %.0f tok/s (copy bandwidth %.0f GB/s)" % (
    b["bytes_per_token"] / 1e6, r["prefill_tok_s"], r["decode_tok_s"], 100 * r["fraction_of_ceiling"],
    r["ceiling_tok_s"], r["bandwidth_gb_s"]))' "$json")"
        else
            note "FAIL bench $dtype"
            failed=1
        fi
    done
    # The CPU beside it, on the same machine: the q8 file, all cores.
    if [ -e "$work/qwen3-0.6b-q8.bin" ]; then
        cpu_json="$work/bench-q8-cpu.json"
        if "$kit/bin/qwen3" bench "$work/qwen3-0.6b-q8.bin" --threads "$(nproc)" --prompt-tokens 128 -n 64 -r 3 --json > "$cpu_json"; then
            [ -n "$out" ] && cp "$cpu_json" "$out/"
            note "cpu q8 ($(nproc) threads, kernels $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["isa"])' "$cpu_json")): $(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["runs"][0]
print("prefill %.0f tok/s, decode %.1f tok/s = %.0f%% of %.0f tok/s" % (r["prefill_tok_s"], r["decode_tok_s"], 100 * r["fraction_of_ceiling"], r["ceiling_tok_s"]))' "$cpu_json")"
        fi
    fi
fi

step "summary"
printf '%s\n' "${summary[@]}" | tee ${out:+"$out/summary.txt"}
if [ "$failed" -ne 0 ]; then
    echo "GPU check: FAILED"
    finish 1
fi
echo "GPU check: passed"
finish 0
