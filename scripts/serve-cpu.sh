#!/usr/bin/env bash
# Measures the CPU `gpuvm serve` uses idle and under load (docs/serve.md §1).
#
#   scripts/serve-cpu.sh [GPUVM_BINARY] [IDLE_SECONDS]
#
# Idle: the daemon with two VMs and no client, IDLE_SECONDS (default 30) of CPU ticks
# (utime + stime of /proc/PID/stat). Under load: two KVM guests (`gpuvm run --kvm
# --vfio-user`, each the full workload set) served by the same daemon at once; the daemon's
# ticks over the run, the clients' wall time, and the BAR accesses the clients trapped to it
# (their "MMIO reads, MMIO writes"; the daemon's own counters restart with each client). Needs /dev/kvm for the load part (skipped with a message
# without it). Prints one JSON object on its last line.
set -euo pipefail
bin="${1:-target/release/gpuvm}"
idle_s="${2:-30}"
hz="$(getconf CLK_TCK)"
dir="$(mktemp -d)"
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }

"$bin" serve --socket-dir "$dir" --vms 2 2>"$dir/serve.log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 100); do [ -S "$dir/control.sock" ] && break; sleep 0.1; done
sleep 2
a="$(ticks $pid)"; sleep "$idle_s"; b="$(ticks $pid)"
idle_ticks=$((b - a))
echo "idle: $idle_ticks ticks of 1/$hz s in $idle_s s" >&2

load='null'
if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
    a="$(ticks $pid)"; t0="$(date +%s.%N)"
    "$bin" run --kvm --vfio-user "$dir/vm0.sock" >"$dir/c0.out" 2>&1 & c0=$!
    "$bin" run --kvm --vfio-user "$dir/vm1.sock" >"$dir/c1.out" 2>&1 & c1=$!
    ok=true
    wait $c0 || ok=false
    wait $c1 || ok=false
    t1="$(date +%s.%N)"; b="$(ticks $pid)"
    wall="$(echo "$t1 - $t0" | bc -l)"
    exits="$(cat "$dir/c0.out" "$dir/c1.out" | sed -n 's/.*; \([0-9]*\) MMIO reads, \([0-9]*\) MMIO writes.*/\1 \2/p' | awk '{s+=$1+$2} END {print s+0}')"
    cpu_s="$(echo "($b - $a) / $hz" | bc -l)"
    per_exit_us="$(echo "if ($exits > 0) $cpu_s * 1000000 / $exits else 0" | bc -l)"
    printf 'load: 2 KVM clients, verified=%s, wall %.2f s, daemon CPU %.2f s (%.0f %% of a core), %s BAR accesses, %.1f us of daemon CPU each\n' \
        "$ok" "$wall" "$cpu_s" "$(echo "100 * $cpu_s / $wall" | bc -l)" "$exits" "$per_exit_us" >&2
    $ok || { cat "$dir/c0.out" "$dir/c1.out" >&2; }
    load="{\"clients\":2,\"verified\":$ok,\"wall_s\":$wall,\"daemon_cpu_s\":$cpu_s,\"bar_accesses\":$exits,\"cpu_us_per_access\":$per_exit_us}"
else
    echo "load: skipped (no /dev/kvm)" >&2
fi
echo "{\"idle_seconds\":$idle_s,\"idle_ticks\":$idle_ticks,\"clk_tck\":$hz,\"load\":$load}"
