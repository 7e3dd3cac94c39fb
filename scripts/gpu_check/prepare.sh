#!/usr/bin/env bash
# The GPU check kit: everything needed to check the CUDA backend on a machine with an NVIDIA GPU
# but no Rust toolchain and no network, built here (no GPU needed) into one folder.
#
#   scripts/gpu_check/prepare.sh DIR    build the kit into DIR (made anew; < 62 MiB)
#   DIR/run.sh                          on the GPU machine; see scripts/gpu_check/run.sh
#
# DIR holds: bin/qwen3 (release, --features cuda), tests/* (qwen3-cuda's test executables with
# --features cuda), fixtures/models/* (the checkpoints those tests and the greedy check read, and
# the real Qwen3 tokenizer for the benchmark checkpoint), make_bench_model.py, greedy.py, run.sh,
# kit_run.sh (scripts/lib/: the log and the step headings run.sh shares with the CPU kit)
# and KIT (what was built, from which commit). The binaries open libcuda and libnvrtc at run
# time (cudarc's dynamic loading), so nothing CUDA is needed here. docs/cuda.md describes the kit.
set -euo pipefail

usage() { echo "usage: scripts/gpu_check/prepare.sh DIR" >&2; exit 2; }
[ $# -eq 1 ] && [ "${1#-}" = "$1" ] || usage
# The path as the caller meant it, before the cd below.
dir=$(realpath -m "$1")
cd "$(dirname "$0")/../.."
. scripts/lib/kit.sh
# The device machine takes up to 64 MiB of carried files; 2 MiB of it left to spare. (The
# binary grew past 60 MiB's kit with the image decoders, which the CLI links since `--image`.)
limit_mib=62

echo "== building qwen3 (release, --features cuda)"
cargo build --release -p qwen3-cli --features cuda

echo "== building qwen3-cuda's test executables (--features cuda)"
# The lib's unit tests are target "qwen3_cuda"; the integration tests are named by file.
mapfile -t tests < <(kit_executables test -p qwen3-cuda --features cuda)
[ "${#tests[@]}" -gt 0 ] || { echo "no test executables were built" >&2; exit 1; }

echo "== laying out $dir"
rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/tests" "$dir/fixtures/models"
# Symbols stripped: the kit must travel, and a panic's message (what the tests assert) survives.
strip -o "$dir/bin/qwen3" target/release/qwen3
for t in "${tests[@]}"; do
    strip -o "$dir/tests/${t%%$'\t'*}" "${t#*$'\t'}"
done
# Every fixture checkpoint but the hybrids': the tests read the full-logit ones and the full-vocabulary one
# (tests/hf_parity.rs, tests/gpu.rs), the greedy check every one with a reference.json, and the
# benchmark checkpoint takes the real Qwen3 tokenizer from the full-vocabulary one.
for f in fixtures/models/*/; do
    f=$(basename "$f")
    # Hybrid models (Qwen3.5's and Qwen3-Next's Gated DeltaNets) have no GPU kernels: the GPU backend refuses them
    # (qwen3-cuda's tests check it on a model of their own), so they do not travel.
    if grep -q '"linear_conv_kernel_dim"' "fixtures/models/$f/config.json" 2>/dev/null; then continue; fi
    # The checkpoint behind the K-quant GGUFs (fixtures/gguf/), read only by the CPU's GGUF tests:
    # the GPU backend refuses K-quants, and the kit stays under its limit without it.
    if [ "$f" = tiny-bf16-tied-k256 ]; then continue; fi
    # Vision checkpoints (an image processor's config beside the weights): the GPU backend
    # refuses images, and neither its tests nor the greedy check read them.
    if [ -f "fixtures/models/$f/preprocessor_config.json" ]; then continue; fi
    mkdir -p "$dir/fixtures/models/$f"
    # logprobs.json is the CLI's logprobs test's, not read here
    find "fixtures/models/$f" -maxdepth 1 -type f ! -name logprobs.json -exec cp {} "$dir/fixtures/models/$f/" \;
    # sentence-transformers' pooling config, in a folder of its own (the embedding fixture)
    if [ -d "fixtures/models/$f/1_Pooling" ]; then cp -r "fixtures/models/$f/1_Pooling" "$dir/fixtures/models/$f/"; fi
done
# The tokenizers travel compressed (the full vocabulary's is 11 MB of text, 2 MB gzipped); run.sh
# unpacks them first thing.
find "$dir/fixtures/models" -name tokenizer.json -exec gzip -9 {} +
cp fixtures/README.md "$dir/fixtures/"  # the fixtures' provenance and the tokenizer's licence
cp scripts/make_bench_model.py scripts/gpu_check/greedy.py scripts/gpu_check/run.sh scripts/lib/kit_run.sh "$dir/"
chmod +x "$dir/run.sh"
{
    kit_stamp
    echo "cudarc: $(sed -n 's/^cudarc = .*version = "\([^"]*\)".*"\(cuda-[0-9]*\)".*/\1, bindings \2/p' qwen3-cuda/Cargo.toml)"
    echo "tests: $(ls "$dir/tests" | tr '\n' ' ')"
    echo "fixtures: $(ls "$dir/fixtures/models" | tr '\n' ' ')"
} > "$dir/KIT"

kit_done "$dir" "$limit_mib"
