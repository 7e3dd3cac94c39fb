#!/usr/bin/env bash
# Lints the aarch64-only code, then runs the qwen3-inference library tests on aarch64 under
# user-mode emulation (qemu-user), so the NEON dot-product kernels
# (qwen3-inference/src/kernels/dot/aarch64.rs) are checked against the scalar ones on every
# commit, without an ARM machine. Used by CI; see docs/performance.md.
#
# Two emulated CPUs cover both aarch64 dispatch paths; on each the whole library test suite
# runs (about 20 s under emulation), the forward-pass tests on the kernels chosen for that CPU:
#   -cpu max         has the dot-product extension: kernels "neon" and "neon-dotprod" (chosen);
#   -cpu cortex-a53  ARMv8.0, no dotprod: kernel "neon" only.
# QWEN3_EXPECT_DOTPROD makes a test fail if the emulated CPU is not the one asked for;
# QWEN3_UNDER_QEMU tells the tests that /proc/self is qemu's rendering (pages.rs).
#
# Needs Debian packages qemu-user and gcc-aarch64-linux-gnu (the linker; its sysroot also gives
# qemu the aarch64 libc) and the Rust target aarch64-unknown-linux-gnu; installs what is
# missing. If they cannot be installed it prints one line saying the check was skipped and why,
# and exits 0. Any build or test failure exits non-zero. Timings under emulation mean nothing:
# this checks results only.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=aarch64-unknown-linux-gnu
SYSROOT=/usr/aarch64-linux-gnu

skip() {
    echo "aarch64 check SKIPPED: $*"
    exit 0
}

if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || skip "qemu-user and gcc-aarch64-linux-gnu are missing and we are not root"
        sudo="sudo -n"
    fi
    echo "== installing qemu-user and gcc-aarch64-linux-gnu (apt-get)"
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
        qemu-user gcc-aarch64-linux-gnu; } >/tmp/check_aarch64_apt.log 2>&1 ||
        skip "apt-get could not install qemu-user gcc-aarch64-linux-gnu (log: /tmp/check_aarch64_apt.log)"
fi

if ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
    echo "== rustup target add $TARGET"
    command -v rustup >/dev/null || skip "rustup is not installed, cannot add the Rust target $TARGET"
    rustup target add "$TARGET" || skip "rustup could not install the Rust target $TARGET (no access to the Rust dist server?)"
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
# The x86-64 lint run never compiles the aarch64-only code, so lint it here.
echo "== cargo clippy -p qwen3-inference --target $TARGET --all-targets -- -D warnings"
cargo clippy -p qwen3-inference --target "$TARGET" --all-targets -- -D warnings
run_on() { # CPU EXPECT_DOTPROD [test binary arguments...]
    local cpu=$1 expect=$2
    shift 2
    echo "== qemu-aarch64 -cpu $cpu: cargo test -p qwen3-inference --lib --target $TARGET $*"
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu $cpu -L $SYSROOT" \
        QWEN3_EXPECT_DOTPROD=$expect QWEN3_UNDER_QEMU=1 \
        cargo test -p qwen3-inference --lib --target "$TARGET" -- "$@"
}
# Builds once (the test profile); each run after that only starts the emulator.
# --nocapture shows the line naming the kernels each CPU ran.
run_on max 1 --nocapture
run_on cortex-a53 0 --nocapture
echo "aarch64 check passed: NEON kernels tested under qemu-aarch64 (-cpu max, -cpu cortex-a53)"
