# Shared by the check kits' prepare steps (scripts/gpu_check/prepare.sh,
# scripts/cpu_check/prepare.sh), which source it from the repository root: how a kit learns its executables' paths, stamps what it
# was built from, and keeps to its size.

# kit_executables CARGO [ARGS...]: runs `cargo CARGO ARGS... --no-run` and prints one line per
# executable it built, "target name<TAB>path" (cargo prints one JSON line per artifact; a test's
# or a benchmark's executable is its "executable"; a lib's unit tests are named after the crate).
kit_executables() {
    local json
    json=$(mktemp)
    cargo "$@" --no-run --message-format=json-render-diagnostics > "$json" || { rm -f "$json"; return 1; }
    python3 - "$json" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"] + "\t" + m["executable"])
PY
    rm -f "$json"
}

# kit_stamp: the KIT file's first lines, the commit and the toolchain.
kit_stamp() {
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(rustc --version)"
}

# kit_done DIR LIMIT_MIB: prints DIR/KIT and the kit's size; fails if it reached LIMIT_MIB (a kit
# must travel).
kit_done() {
    local size_kib
    size_kib=$(du -sk "$1" | cut -f1)
    cat "$1/KIT"
    echo "kit: $1, $((size_kib / 1024)) MiB"
    if [ "$size_kib" -ge $(($2 * 1024)) ]; then
        echo "the kit is $((size_kib / 1024)) MiB, over its $2 MiB limit" >&2
        return 1
    fi
}
