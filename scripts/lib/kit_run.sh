# Shared by the check kits' run steps (scripts/cpu_check/run.sh, scripts/gpu_check/run.sh), which
# their prepare steps copy into the kit beside this file (as DIR/kit_run.sh) and which source it:
# the log that goes to stdout and a file, the exit that waits for it, and the step headings.

# kit_log FILE: from here on, everything this script and its commands print goes to stdout and
# to FILE too (FILE's folder is made).
kit_log() {
    mkdir -p "$(dirname "$1")"
    exec > >(tee "$1") 2>&1
    kit_tee_pid=$!
}

# kit_exit STATUS: exits with STATUS once the log's tee (if kit_log started one) has written
# everything: the script's last lines must reach the file before the caller reads it.
kit_exit() {
    if [ -n "${kit_tee_pid:-}" ]; then exec >&- 2>&-; wait "$kit_tee_pid"; fi
    exit "$1"
}

# step TITLE...: a step's heading in the log.
step() { echo; echo "== $*"; }
