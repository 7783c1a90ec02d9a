#!/bin/bash
# Moves a guest mid-workload live between two `gpuvm serve` daemons, the vGPU carried by the
# guest's VMM (docs/migration.md, "Between two gpuvm serve daemons"), and prints the figures.
# With --in-process: the same guest migrated between two VMM processes whose vGPU is in process
# (the baseline). Needs /dev/kvm and a release build (cargo build --release --bin gpuvm).
# Environment: SIZE (workload size, 256), EXITS (exits before the move, 2000), VRAM (MiB, 256).
set -euo pipefail
G=${G:-$(cd "$(dirname "$0")/.." && pwd)/target/release/gpuvm}
[ -x "$G" ] || { echo "no $G: cargo build --release --bin gpuvm" >&2; exit 2; }
D=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$D"' EXIT
cd "$D"
WORK=(--workload madd --workload mmul --workload memcpy_dtoh --workload fmadd
      --workload memcpy_htod --workload mmul --workload fmmul --workload loop)
COMMON=(--json --quiet-console --timeout 300)
# Waits for socket $1, made by process $2 (which logs to $3): fails, with that log, if the
# process exits first or the socket is not there after 60 s.
wait_sock() {
    for _ in $(seq 1 1200); do
        [ -S "$1" ] && return 0
        if ! kill -0 "$2" 2>/dev/null; then
            echo "$3: the process that serves $1 exited first:" >&2; cat "$3" >&2; exit 1
        fi
        sleep 0.05
    done
    echo "$1 did not appear within 60 s; $3:" >&2; cat "$3" >&2; exit 1
}
if [ "${1:-}" = --in-process ]; then
    SRC=(); DST=()
else
    $G serve --socket-dir A --vms 1 --vram-mib "${VRAM:-256}" 2> a.log &
    APID=$!
    $G serve --socket-dir B --vms 1 --vram-mib "${VRAM:-256}" 2> b.log &
    BPID=$!
    wait_sock A/vm0.sock $APID a.log; wait_sock B/vm0.sock $BPID b.log
    SRC=(--vfio-user A/vm0.sock); DST=(--vfio-user B/vm0.sock)
fi
$G run --kvm "${DST[@]}" --migrate-listen m.sock "${COMMON[@]}" > dst.json 2> dst.log &
DPID=$!
wait_sock m.sock $DPID dst.log
$G run --kvm "${SRC[@]}" --vms 1 --size "${SIZE:-256}" "${WORK[@]}" "${COMMON[@]}" \
    --migrate-to m.sock --migrate-after-exits "${EXITS:-2000}" > src.json 2> src.log ||
    { echo "the source VMM failed (exit $?):" >&2; cat src.log >&2; exit 1; }
wait $DPID || { echo "the destination VMM failed (exit $?):" >&2; cat dst.log >&2; exit 1; }
python3 - "${1:-daemons}" <<'P'
import json, sys
s = json.load(open('src.json'))['vms'][0]; d = json.load(open('dst.json'))['vms'][0]
h = s['kvm']['handoff']
print(json.dumps({
    "mode": sys.argv[1],
    "verified_in_source": sum(w['verified'] for w in s['workloads']),
    "verified_in_destination": sum(w['verified'] for w in d['workloads']),
    "workloads": len(d['workloads']),
    "rounds": len(h['rounds']),
    "vgpu_stream_bytes": h['vgpu_stream_bytes'],
    "dma_pages": h['dma_pages'],
    "total_ms": round(h['total_ns'] / 1e6, 1),
    "downtime_ms": round(h['downtime_ns'] / 1e6, 1),
}))
P
if [ -f a.log ]; then grep -h "migration\|restored" a.log b.log | sed 's/^/  /' >&2; fi
