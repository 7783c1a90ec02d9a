#!/usr/bin/env bash
# The engines-and-locks measurements (docs/benchmarks.md, "Locks and engines"), side by side:
# every figure is taken with each given binary in one run, on one machine.
#
#   scripts/bench-locks.sh OUT_DIR NEW_BIN [OLD_BIN]
#
# NEW_BIN runs everything: `exp traps` (fast path on and off), `exp lockhold` (real and sim
# clock), `exp scale` in-process (mmul 128 and madd 16) and under KVM (1, 16, 64 VMs, if
# /dev/kvm is there and SKIP_KVM is unset). Each step is cut off after STEP_TIMEOUT seconds
# (240); progress.log says when each began. OLD_BIN, a build from before the change, runs the lockhold and
# in-process scale figures again for the comparison. JSON files land in OUT_DIR; the SVGs too,
# and all of them in OUT_DIR/bench-locks.tar (for the device tool, which returns 8 files).
set -uo pipefail
out=${1:?OUT_DIR}
new=${2:?NEW_BIN}
old=${3:-}
mkdir -p "$out"
log() { echo "[$(date +%T)] $*" | tee -a "$out/progress.log" >&2; }
# STEPS (space-separated step names) limits the run to those steps; SCALE_VMS sets the VM counts
# of the in-process scale figures (1,2,4,8,16,32,64).
steps=${STEPS:-traps traps-nofast lockhold lockhold-sim scale-mmul scale-madd old-lockhold old-scale-mmul old-scale-madd scale-kvm}
vms=${SCALE_VMS:-1,2,4,8,16,32,64}
run() { # name bin args... (each step at most ${STEP_TIMEOUT:-240} s)
    local name=$1 bin=$2
    shift 2
    case " $steps " in *" $name "*) ;; *) return 0 ;; esac
    log "$name"
    timeout "${STEP_TIMEOUT:-240}" "$bin" "$@" --json >"$out/$name.json" 2>"$out/$name.err" ||
        log "$name: exit $?"
    # Packed after every step: a run cut short still returns what it measured.
    tar -C "$out" -cf "$out/bench-locks.tar" --exclude bench-locks.tar .
}
echo "cpus: $(nproc)" >"$out/machine.txt"
uname -a >>"$out/machine.txt"
run traps "$new" exp traps --vms 1,2,4,8,16,32,64 --duration-ms 300 --svg "$out/traps.svg"
run traps-nofast "$new" exp traps --vms 1,2,4,8,16,32,64 --duration-ms 300 --no-fast-path
run lockhold "$new" exp lockhold --rounds 2
run lockhold-sim "$new" exp lockhold --rounds 2 --clock sim
run scale-mmul "$new" exp scale --clock real --vms "$vms"
run scale-madd "$new" exp scale --clock real --workload madd --size 16 --vms "$vms"
if [ -n "$old" ]; then
    run old-lockhold "$old" exp lockhold --rounds 2
    run old-scale-mmul "$old" exp scale --clock real --vms "$vms"
    run old-scale-madd "$old" exp scale --clock real --workload madd --size 16 --vms "$vms"
fi
if [ -e /dev/kvm ] && [ -z "${SKIP_KVM:-}" ]; then
    run scale-kvm "$new" exp scale --kvm --vms 1,16,64
fi
tar -C "$out" -cf "$out/bench-locks.tar" --exclude bench-locks.tar .
log done
