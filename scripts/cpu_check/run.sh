#!/usr/bin/env bash
# The CPU check kit's run step (scripts/cpu_check/prepare.sh DIR copies this to DIR/run.sh): on
# a Linux machine of the architecture the kit was built on (x86-64 or aarch64), with python3 and
# torch (for the random checkpoints; with transformers too for llama.cpp's converter); no Rust
# toolchain, no network. In order:
#   1. the machine: the CPU's model and the instruction sets the kernels use, and which kernel
#      families (QWEN3_KERNELS) this CPU has;
#   2. the library's unit tests once per family but scalar (QWEN3_KERNELS=F): every kernel of
#      every family against its scalar reference, and the forward pass, the batching and the
#      sampler on F;
#      then the kernels alone, from the caches and from memory (benches/kernels.rs);
#   3. a random checkpoint of each shape in $SHAPES (default 0.6b; or the HF checkpoint folders in
#      $CHECKPOINTS, comma-separated, made by nothing), exported as q8, q4 (the default mix) and
#      plain q4 (--tables q4 --sensitive q4), and with llama.cpp in the kit, converted to GGUF and
#      quantized to Q4_K_M, Q4_0 and Q8_0;
#   4. $ROUNDS rounds (default 3) of alternating single runs, as docs/kernels.md measures:
#      each round runs `qwen3 bench F --prompt-tokens 128 -n 64 --threads $THREADS -r 1` for
#      every file and family, then `llama-bench -p 128 -n 64 -t $THREADS -r 1` on each GGUF;
#   5. summary.py's tables: each cell's median over the rounds, the share of the ceiling, and the
#      q4 file against our q8 and llama.cpp's Q4_K_M, held to its family's goals.
# Everything goes to stdout, and with $OUT set also to $OUT/cpu_check.log, with the tables in
# $OUT/summary.md and every run's JSON (and the kernels' report) in $OUT/runs/. Exit status 0
# when every test passed and every run ran. $PYTHON names the Python (default python3);
# $QWEN3_CPU_CHECK_WORK the work folder (default $TMPDIR/qwen3-cpu-check, made anew).
# QWEN3_KERNELS from the caller's environment is ignored: each step sets its own.
set -uo pipefail
kit=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
shapes=${SHAPES:-0.6b}
rounds=${ROUNDS:-3}
threads=${THREADS:-1,2}
unset QWEN3_KERNELS

out=${OUT:-}
work=${QWEN3_CPU_CHECK_WORK:-${TMPDIR:-/tmp}/qwen3-cpu-check}
# The work folder is made anew: refuse to empty one that is not an earlier work folder.
if [ -e "$work" ] && [ -n "$(ls -A "$work" 2> /dev/null)" ] && [ ! -e "$work/.qwen3-cpu-check" ]; then
    echo "$work exists and is not this kit's work folder: set QWEN3_CPU_CHECK_WORK to a new one" >&2
    exit 1
fi
rm -rf "$work" && mkdir -p "$work/runs" && touch "$work/.qwen3-cpu-check"
. "$kit/kit_run.sh"
if [ -n "$out" ]; then kit_log "$out/cpu_check.log"; fi
# Every run's JSON goes to $OUT too, then the log is waited for (kit_exit).
finish() {
    if [ -n "$out" ]; then rm -rf "$out/runs" && cp -r "$work/runs" "$out/"; fi
    kit_exit "$1"
}
failed=0
fail() { echo "-- FAIL: $*"; failed=1; }
qwen3="$kit/bin/qwen3"

step "1. the machine"
cat "$kit/KIT"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
[ -n "$cpu" ] || cpu=$(uname -m)
# The flags the kernel families are chosen by (kernels/dot/x86/mod.rs, aarch64.rs), and AMX.
flags=$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo | tr ' ' '\n' | grep -x -E 'avx2|fma|f16c|avx_vnni|avx512f|avx512bw|avx512vl|avx512_vnni|avx512_vbmi|avx512_bf16|amx_tile|asimd|asimddp' | paste -sd ' ')
echo "cpu: $cpu; $(nproc) CPUs; kernel $(uname -r)"
echo "instruction sets: ${flags:-none of those the kernels use}"
# qwen3 must run here at all (the kit's architecture, its C library) before anything is asked.
if ! ver=$("$qwen3" --version 2>&1); then
    echo "$ver"
    fail "$qwen3 does not run on this machine (built for $(sed -n 's/.* on \([^,]*\),.*/\1/p' "$kit/KIT"), this is $(uname -m))"
    finish 1
fi
# A family this CPU lacks is refused by name before any work; any other family gets as far as
# the missing file.
families=()
for f in scalar avx2 avx-vnni avx512 neon neon-dotprod; do
    msg=$(QWEN3_KERNELS=$f "$qwen3" info "$work/no-such-file" 2>&1)
    if grep -q "QWEN3_KERNELS=$f:" <<< "$msg"; then
        continue
    elif grep -q "no-such-file" <<< "$msg"; then
        families+=("$f")
    else
        echo "$msg"
        fail "qwen3 with QWEN3_KERNELS=$f said neither that the CPU lacks it nor that the file is missing"
    fi
done
echo "kernel families: ${families[*]}"
echo "cpu: $cpu; $(nproc) CPUs; instruction sets: $flags; kernel families: ${families[*]}" > "$work/runs/machine.txt"
# Timed: every family but the scalar reference, which exists to be exact, not fast.
timed=()
for f in "${families[@]}"; do [ "$f" = scalar ] || timed+=("$f"); done
[ "${#timed[@]}" -gt 0 ] || fail "no SIMD kernel family on this CPU: nothing of ours to time"

step "2. the library's unit tests, once per kernel family"
# Some tests read fixture files by the path compiled in from the source tree, which only the
# machine that built the kit has; they test the tokenizer, the chat cache, GGUF files and the image
# processor, not the kernels.
skip=(--skip chat::conversation::tests --skip tokenizer::pretokenize::tests::pieces_match_hf_pre_tokenizer
      --skip gguf::tests --skip vision::tests)
for f in "${families[@]}"; do
    [ "$f" = scalar ] && continue
    log="$work/test-$f.log"
    (cd "$work" && QWEN3_KERNELS=$f timeout 600 "$kit/tests/qwen3_inference" "${skip[@]}" 2>&1) > "$log"
    rc=$?
    counts=$(grep -o 'test result: .*' "$log" | tail -1)
    if [ "$rc" -ne 0 ]; then
        grep -E '^(test .* FAILED|---- |thread .* panicked)' "$log" | head -20
        fail "unit tests with QWEN3_KERNELS=$f (exit $rc): ${counts:-no result line}"
    else
        echo "-- PASS unit tests with QWEN3_KERNELS=$f: ${counts#test result: }"
    fi
done

step "2b. the kernels alone, every family, one thread (qwen3-inference/benches/kernels.rs)"
# From the caches (the arithmetic's limit) and from memory, q4, q6 and q8, decode and prefill.
if (cd "$work" && timeout 600 "$kit/bin/kernels-bench") > "$work/runs/kernels.txt" 2>&1; then
    grep -E 'q4|q6' "$work/runs/kernels.txt"
    echo "-- the whole report: kernels.txt"
else
    tail -5 "$work/runs/kernels.txt"
    fail "the kernels' benchmark"
fi

step "3. the checkpoints and their files"
llama="$kit/llama.cpp"
have_llama=0
if [ -x "$llama/bin/llama-bench" ]; then
    have_llama=1
    export LD_LIBRARY_PATH="$llama/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # llama.cpp's converter reads a Qwen tokenizer from tokenizer.json only after failing to find
    # a tokenizer.model for sentencepiece, and it imports sentencepiece before it looks: where the
    # package is missing, an empty stand-in lets it look, not find, and go on to tokenizer.json.
    if ! "$py" -c 'import sentencepiece' 2> /dev/null; then
        mkdir -p "$work/stand-in/sentencepiece"
        echo 'class SentencePieceProcessor: pass' > "$work/stand-in/sentencepiece/__init__.py"
        export PYTHONPATH="$work/stand-in${PYTHONPATH:+:$PYTHONPATH}"
    fi
else
    echo "-- no llama.cpp in this kit: ours only"
fi
given=()
if [ -n "${CHECKPOINTS:-}" ]; then
    IFS=, read -r -a given <<< "$CHECKPOINTS"
    shape_list=()
    for c in "${given[@]}"; do shape_list+=("$(basename "$c")"); done
else
    IFS=, read -r -a shape_list <<< "$shapes"
fi
for k in "${!shape_list[@]}"; do
    s=${shape_list[$k]}
    if [ "${#given[@]}" -gt 0 ]; then
        ckpt=${given[$k]}
    else
        ckpt="$work/$s"
        if ! "$py" "$kit/make_bench_model.py" --shape "$s" "$ckpt" --qwen3-tokenizer "$kit/tokenizer" > "$work/make-$s.log" 2>&1; then
            tail -3 "$work/make-$s.log"
            fail "the $s checkpoint could not be made (python3 with torch is needed)"
            continue
        fi
    fi
    for spec in "q8:--dtype q8" "q4:--dtype q4" "q4-plain:--dtype q4 --tables q4 --sensitive q4"; do
        name=${spec%%:*}
        # shellcheck disable=SC2086
        if ! "$qwen3" export "$ckpt" "$work/$s-$name.bin" ${spec#*:} > "$work/export-$s-$name.log" 2>&1; then
            tail -3 "$work/export-$s-$name.log"
            fail "export $s $name"
        fi
    done
    if [ "$have_llama" = 1 ]; then
        if "$py" "$llama/convert_hf_to_gguf.py" "$ckpt" --outtype bf16 --outfile "$work/$s-bf16.gguf" > "$work/convert-$s.log" 2>&1; then
            for q in Q4_K_M Q4_0 Q8_0; do
                "$llama/bin/llama-quantize" "$work/$s-bf16.gguf" "$work/$s-$q.gguf" "$q" > "$work/quantize-$s-$q.log" 2>&1 \
                    || { tail -3 "$work/quantize-$s-$q.log"; fail "llama-quantize $s $q"; }
            done
            rm -f "$work/$s-bf16.gguf"
        else
            tail -5 "$work/convert-$s.log"
            fail "convert_hf_to_gguf.py $s (it needs torch, transformers, numpy, pyyaml)"
        fi
    fi
    # A checkpoint made here is not read again: its disk goes back.
    [ "${#given[@]}" -gt 0 ] || rm -rf "$ckpt"
    for f in "$work/$s"-{q8,q4,q4-plain}.bin "$work/$s"-{Q4_K_M,Q4_0,Q8_0}.gguf; do
        [ -e "$f" ] && echo "   $f $(du -m "$f" | cut -f1) MiB"
    done
done

step "4. $rounds rounds of alternating single runs (threads $threads)"
for r in $(seq 1 "$rounds"); do
    for s in "${shape_list[@]}"; do
        for name in q8 q4 q4-plain; do
            model="$work/$s-$name.bin"
            [ -e "$model" ] || continue
            for f in "${timed[@]}"; do
                json="$work/runs/ours-$s-$name-$f-$r.json"
                if QWEN3_KERNELS=$f timeout 600 "$qwen3" bench "$model" --prompt-tokens 128 -n 64 --threads "$threads" -r 1 --json > "$json" 2> "$work/bench.err"; then
                    "$py" -c '
import json, sys
b = json.load(open(sys.argv[1]))
print("   round %s %s %-8s %-12s" % (sys.argv[2], sys.argv[3], sys.argv[4], b["isa"]), "  ".join(
    "%dt: decode %.1f (%s) prefill %.1f" % (x["threads"], x["decode_tok_s"], "-" if x["fraction_of_ceiling"] is None else "%.0f%%" % (100 * x["fraction_of_ceiling"]), x["prefill_tok_s"])
    for x in b["runs"]))' "$json" "$r" "$s" "$name"
                else
                    cat "$work/bench.err"
                    rm -f "$json"
                    fail "bench $s $name with QWEN3_KERNELS=$f"
                fi
            done
        done
        if [ "$have_llama" = 1 ]; then
            for q in Q4_K_M Q4_0 Q8_0; do
                gguf="$work/$s-$q.gguf"
                [ -e "$gguf" ] || continue
                json="$work/runs/llama-$s-$q-$r.json"
                if timeout 600 "$llama/bin/llama-bench" -m "$gguf" -p 128 -n 64 -t "$threads" -ngl 0 -r 1 -o json > "$json" 2> "$work/llama.err"; then
                    "$py" -c '
import json, sys
rows = json.load(open(sys.argv[1]))
print("   round %s %s %-8s %-12s" % (sys.argv[2], sys.argv[3], sys.argv[4], "llama.cpp"), "  ".join(
    "%dt: %s %.1f" % (x["n_threads"], "decode" if x["n_gen"] else "prefill", x["avg_ts"]) for x in rows))' "$json" "$r" "$s" "$q"
                else
                    tail -3 "$work/llama.err"
                    rm -f "$json"
                    fail "llama-bench $s $q"
                fi
            done
        fi
    done
done

step "5. summary"
if "$py" "$kit/summary.py" "$work/runs" > "$work/summary.md"; then
    cat "$work/summary.md"
    [ -n "$out" ] && cp "$work/summary.md" "$out/"
else
    fail "summary.py"
fi
if [ "$failed" -ne 0 ]; then
    echo "CPU check: FAILED"
    finish 1
fi
echo "CPU check: passed"
finish 0
