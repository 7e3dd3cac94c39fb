#!/usr/bin/env bash
# The CPU check kit: every kernel family a machine has, tested and timed on that machine, side by
# side with llama.cpp, for a machine with no Rust toolchain and no network (a lent GPU's host, whose
# CPU has AVX-512 and AVX-VNNI where our own machines may have only AVX2). Built here, into one
# folder:
#
#   scripts/cpu_check/prepare.sh DIR [--llama-cpp BUILD SRC]
#   DIR/run.sh                          there; see scripts/cpu_check/run.sh
#
# DIR holds: bin/qwen3 (release), tests/qwen3_inference (the library's unit tests, release: every
# kernel against its scalar reference, the forward pass against the plain backend),
# bin/kernels-bench (qwen3-inference/benches/kernels.rs: each kernel alone, per family),
# tokenizer/ (the real Qwen3 tokenizer, for the benchmark checkpoints), make_bench_model.py,
# run.sh, summary.py, kit_run.sh (scripts/lib/: the log and the step headings run.sh shares with
# the GPU kit) and KIT (what was built, from which commit). With --llama-cpp, also
# llama.cpp/: llama-bench and llama-quantize from BUILD (a CMake build of llama.cpp made with
# -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON, so that it picks its kernels
# for the CPU it runs on), their shared libraries, and convert_hf_to_gguf.py with the Python
# packages it imports from SRC (llama.cpp's source tree), with llama.cpp's licence. None of
# llama.cpp is committed here; the kit is built outside the repository's history (DIR under
# target/, say) and is not committed either. docs/benchmarks.md ("Every kernel family on one
# machine") describes it.
set -euo pipefail

usage() { echo "usage: scripts/cpu_check/prepare.sh DIR [--llama-cpp BUILD SRC]" >&2; exit 2; }
[ -n "${1:-}" ] && [ "${1#-}" = "$1" ] || usage
# The paths as the caller meant them, before the cd below.
dir=$(realpath -m "$1")
shift
llama_build="" llama_src=""
if [ $# -gt 0 ]; then
    [ "$1" = --llama-cpp ] && [ $# -eq 3 ] || usage
    llama_build=$(realpath -m "$2") llama_src=$(realpath -m "$3")
    for f in "$llama_build/bin/llama-bench" "$llama_build/bin/llama-quantize" "$llama_src/convert_hf_to_gguf.py" "$llama_src/gguf-py/gguf"; do
        [ -e "$f" ] || { echo "--llama-cpp: $f not found" >&2; exit 1; }
    done
    # A native build runs only on CPUs like the one it was built on, and would fault elsewhere.
    if ! ls "$llama_build"/bin/libggml-cpu-*.so > /dev/null 2>&1; then
        echo "--llama-cpp: $llama_build has no libggml-cpu-<variant>.so: build it with -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON" >&2
        exit 1
    fi
fi
limit_mib=60
cd "$(dirname "$0")/../.."
. scripts/lib/kit.sh
# DIR is made anew: refuse to empty a folder that is not an earlier kit.
if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2> /dev/null)" ] && [ ! -e "$dir/KIT" ]; then
    echo "$dir exists and is not a kit (no KIT file): give a new folder" >&2
    exit 1
fi

echo "== building qwen3 (release)"
cargo build --release -p qwen3-cli

echo "== building the library's unit tests (release)"
unit=$(kit_executables test --release -p qwen3-inference --lib | cut -f2)
[ -n "$unit" ] || { echo "the unit tests were not built" >&2; exit 1; }

echo "== building the kernels' benchmark (qwen3-inference/benches/kernels.rs)"
kbench=$(kit_executables bench -p qwen3-inference --bench kernels | awk -F'\t' '$1 == "kernels" { print $2 }')
[ -n "$kbench" ] || { echo "the kernels' benchmark was not built" >&2; exit 1; }

echo "== laying out $dir"
rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/tests" "$dir/tokenizer"
strip -o "$dir/bin/qwen3" target/release/qwen3
strip -o "$dir/tests/qwen3_inference" "$unit"
strip -o "$dir/bin/kernels-bench" "$kbench"
# The real Qwen3 tokenizer (Apache-2.0; fixtures/README.md says where it comes from).
cp fixtures/models/tiny-qwen3-fullvocab/tokenizer.json fixtures/models/tiny-qwen3-fullvocab/tokenizer_config.json "$dir/tokenizer/"
cp fixtures/README.md "$dir/tokenizer/"
cp scripts/make_bench_model.py scripts/cpu_check/run.sh scripts/cpu_check/summary.py scripts/lib/kit_run.sh "$dir/"
chmod +x "$dir/run.sh"
if [ -n "$llama_build" ]; then
    l="$dir/llama.cpp"
    mkdir -p "$l/bin" "$l/gguf-py"
    cp -L "$llama_build/bin/llama-bench" "$llama_build/bin/llama-quantize" "$l/bin/"
    # The shared libraries, each once, under the name the loader asks for (its SONAME; the
    # build's symlinks are not copied), and every CPU variant: ggml loads the best one for the
    # CPU at run time. No GPU backend (libggml-cuda and the like): llama.cpp is timed on the CPU,
    # beside ours.
    for so in "$llama_build"/bin/*.so*; do
        [ -L "$so" ] && continue
        case $(basename "$so") in
            libggml-base.so* | libggml.so* | libggml-cpu-*.so | libllama*.so* | libmtmd.so*) ;;
            *) continue ;;
        esac
        soname=$(objdump -p "$so" | awk '$1 == "SONAME" { print $2 }')
        cp "$so" "$l/bin/${soname:-$(basename "$so")}"
    done
    # ggml's CPU backend uses OpenMP: GCC's runtime goes along, for a host without it.
    gomp=$(ldd "$l"/bin/libggml-cpu-x64.so 2> /dev/null | awk '/libgomp/ { print $3 }')
    if [ -n "$gomp" ]; then cp "$gomp" "$l/bin/"; fi
    strip "$l"/bin/* 2> /dev/null || true
    cp "$llama_src/convert_hf_to_gguf.py" "$llama_src/LICENSE" "$l/"
    [ -d "$llama_src/conversion" ] && cp -r "$llama_src/conversion" "$l/"
    cp -r "$llama_src/gguf-py/gguf" "$l/gguf-py/"
    find "$l" -name __pycache__ -type d -prune -exec rm -rf {} +
fi
{
    kit_stamp
    if [ -n "$llama_build" ]; then
        # (llama-bench reports its build's commit in each run's JSON; summary.py prints it.)
        echo "llama.cpp: llama-bench, llama-quantize and the converter; CPU variants $(cd "$llama_build/bin" && ls libggml-cpu-*.so | sed 's/libggml-cpu-//; s/\.so//' | tr '\n' ' ')"
    else
        echo "llama.cpp: not in this kit"
    fi
} > "$dir/KIT"

kit_done "$dir" "$limit_mib"
