#!/usr/bin/env bash
# In-process FV against native in instructions, not in wall time: what the device model adds
# to one run of each workload, counted by valgrind's callgrind — the same figure on any x86-64
# machine and in any load, where `gpuvm exp overhead`'s wall-time ratios move by ±0.1 with the
# machine's noise (docs/benchmarks.md, sixteenth round).
#
#   scripts/fv-instructions.sh [GPUVM_BIN] > fv-instructions.json
#
# For each workload and each of `native` and the shadow modes in SCHEMES (default
# `incremental`, i.e. `fv`; also `lazy`, `eager`, `pv`), the binary runs the workload N1 and
# then N2 times after one bring-up (`gpuvm native` / `gpuvm run --vms 1`, simulated clock) under
# callgrind; (Ir(N2) - Ir(N1)) / (N2 - N1) is one run's instructions with bring-up, start-up
# and exit cancelled out. Only instructions inside `gpuvm_guest::workloads::run` are counted
# (callgrind's --toggle-collect): one workload run with all it calls — the driver, the device
# model, the simulator, all on the run's thread with the simulated clock. The harness's per-run
# work outside it — the table row each run adds to the output (~16 K instructions) and the
# parsing of one more `--workload` argument (~4-5 K) — is not part of a run, and wall-time
# figures leave it out too (until 2026-11-29 it was counted, which read every ratio low: a
# size-16 copy 1.43 instead of 1.54).
# SIZE (64), N1 (20), N2 (120) and WORKLOADS (all seven) can be set in the environment.
# Prints one JSON object (`results[]`: workload, scheme, instructions_per_run,
# relative_to_native) and a table on stderr. Instructions are not time: memory stalls, lock
# waits and page faults cost time they do not count. Installs valgrind with apt-get if it is
# missing (root).
set -euo pipefail
bin=${1:-target/release/gpuvm}
size=${SIZE:-64}
n1=${N1:-20}
n2=${N2:-120}
workloads=${WORKLOADS:-madd mmul fmadd fmmul memcpy_htod memcpy_dtoh loop}
schemes=${SCHEMES:-incremental}
[ -x "$bin" ] || { echo "no gpuvm binary at $bin (cargo build --release -p gpuvm-app)" >&2; exit 2; }
if ! command -v valgrind >/dev/null; then
    echo "valgrind missing: installing it" >&2
    apt-get update -qq && apt-get install -y -qq valgrind >/dev/null
fi
# Instructions of one process: the binary's arguments, then N workload runs.
ir() { # scheme workload n
    local scheme=$1 w=$2 n=$3 args=()
    for _ in $(seq "$n"); do args+=(--workload "$w"); done
    local cmd=(native --size "$size" --clock sim)
    [ "$scheme" = native ] || cmd=(run --vms 1 --shadow "$scheme" --size "$size" --clock sim)
    valgrind --tool=callgrind --toggle-collect='gpuvm_guest::workloads::run' \
        --callgrind-out-file=/dev/null "$bin" "${cmd[@]}" "${args[@]}" \
        2>&1 >/dev/null | awk '/Collected :/ {print $NF}'
}
rows=()
for w in $workloads; do
    for scheme in native $schemes; do
        a=$(ir "$scheme" "$w" "$n1")
        b=$(ir "$scheme" "$w" "$n2")
        [ -n "$a" ] && [ -n "$b" ] || { echo "callgrind gave no count for $w/$scheme" >&2; exit 1; }
        rows+=("$w $scheme $(( (b - a) / (n2 - n1) ))")
        echo "  $w $scheme: $(( (b - a) / (n2 - n1) )) instructions a run" >&2
    done
done
printf '%s\n' "${rows[@]}" | python3 -c '
import json, sys
size, n1, n2 = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rows = [l.split() for l in sys.stdin if l.strip()]
native = {w: int(ir) for w, s, ir in rows if s == "native"}
out = [{"workload": w, "scheme": "fv" if s == "incremental" else s,
        "instructions_per_run": int(ir),
        "relative_to_native": round(int(ir) / max(native[w], 1), 4)} for w, s, ir in rows]
for r in out:
    print("%-12s %-8s %10d %6.3fx" % (r["workload"], r["scheme"], r["instructions_per_run"],
          r["relative_to_native"]), file=sys.stderr)
print(json.dumps({"size": size, "runs": [n1, n2], "results": out}, indent=1))
' "$size" "$n1" "$n2"
