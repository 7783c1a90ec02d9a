#!/usr/bin/env bash
# End to end: an unmodified Cloud Hypervisor runs gpuvm's bare-metal guest on a vGPU served by
# `gpuvm serve` over vfio-user, next to `gpuvm run --kvm --vfio-user` on the same daemon.
#
#   scripts/cloud-hypervisor-e2e.sh CH_BINARY
#
# CH_BINARY is a cloud-hypervisor binary (v53.0 was used; it is in no package registry, see
# docs/cloud-hypervisor.md for building it). The gpuvm binary and the guest ELF are taken from
# $GPUVM and $GUEST, or else built with `cargo build --release -p gpuvm-app` into
# $CARGO_TARGET_DIR (or target/). Environment knobs: SIZE (problem size, default 16: every BAR
# access is a message, so larger sizes take minutes), WORKLOADS (comma-separated, default every
# workload), CH_TIMEOUT (seconds per CH VM, 600).
#
# What it does:
#   0. Without the flag: a daemon started without --allow-unsealed-dma and one CH VM on it. CH
#      shares guest RAM that is not a sealed memfd, so its first DMA_MAP is refused and the
#      daemon closes the connection: CH must exit non-zero within a second of its start, and
#      the daemon's log must name --allow-unsealed-dma. (Before issue 26 the refusal was an
#      error reply CH ignored; the guest ran ~10 s of driver init, died on an MMU fault, and CH
#      exited 0.)
# Then, with one daemon (`gpuvm serve --vms 2 --allow-unsealed-dma`) for everything:
#   1. `gpuvm run --kvm --vfio-user vm0.sock`, fences polled, then by interrupt: the reference.
#   2. One CH VM on vm0.sock, three times: fences polled, by INTx, by MSI.
#   3. Two CH VMs at once (vm0: INTx, vm1: MSI), sharing the GPU.
# Every VM must end with every workload verified ("PASS" on its console); the script exits
# non-zero if any does not. It prints per run the wall time, the guest's driver bring-up time,
# per workload the guest's time, its BAR accesses (each one a trapped MMIO exit) and the
# vfio-user messages the daemon counted for it (from the guest's phase markers on BAR5).
set -uo pipefail

if [ $# -ne 1 ] || [ ! -x "$1" ]; then
    echo "usage: $0 CH_BINARY (an executable cloud-hypervisor)" >&2
    exit 2
fi
ch="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
size="${SIZE:-16}"
workloads="${WORKLOADS:-madd,mmul,fmadd,fmmul,memcpy_htod,memcpy_dtoh,loop}"
ch_timeout="${CH_TIMEOUT:-600}"

if [ -z "${GPUVM:-}" ]; then
    (cd "$repo" && cargo build --release -p gpuvm-app) || exit 1
    GPUVM="$target/release/gpuvm"
fi
GUEST="${GUEST:-$target/gpuvm-guest-bin/x86_64-unknown-linux-gnu/release/gpuvm-guest-bin}"
for f in "$GPUVM" "$GUEST"; do
    [ -e "$f" ] || { echo "missing $f" >&2; exit 1; }
done

work="$(mktemp -d /tmp/gpuvm-ch-e2e.XXXXXX)"
daemon_pid=""
sealed_pid=""
cleanup() {
    [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
    [ -n "$sealed_pid" ] && kill "$sealed_pid" 2>/dev/null && wait "$sealed_pid" 2>/dev/null
    echo "logs kept in $work"
}
trap cleanup EXIT

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

failures=0
summary=()

# 0. Without --allow-unsealed-dma: CH must be refused at once, with the flag named.
"$GPUVM" serve --socket-dir "$work/sealed" --vms 1 >/dev/null 2>"$work/sealed.log" &
sealed_pid=$!
for _ in $(seq 1 300); do
    [ -S "$work/sealed/vm0.sock" ] && break
    kill -0 "$sealed_pid" 2>/dev/null || break
    sleep 0.1
done
[ -S "$work/sealed/vm0.sock" ] || { echo "gpuvm serve (sealed) did not come up:"; cat "$work/sealed.log"; exit 1; }
t0=$(now_ms)
timeout 60 "$ch" --kernel "$GUEST" --cmdline "size=$size workloads=madd irq=poll" \
    --memory size=256M,shared=on --user-device "socket=$work/sealed/vm0.sock" \
    --serial "file=$work/unsealed.console" --console off --cpus boot=1 \
    >"$work/unsealed.ch.log" 2>&1
rc=$?
wall=$(( $(now_ms) - t0 ))
named=no
grep -q -- "--allow-unsealed-dma" "$work/sealed.log" && named=yes
verdict=FAIL
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$wall" -le 1000 ] && [ "$named" = yes ] && verdict=PASS
[ "$verdict" = PASS ] || failures=$(( failures + 1 ))
echo "== cloud-hypervisor without --allow-unsealed-dma: $verdict (CH exit $rc after ${wall} ms; flag named in the daemon's log: $named)"
grep -E "device failed|not sealed" "$work/sealed.log" | sed 's/^/    daemon: /'
tail -n 5 "$work/unsealed.ch.log" | sed 's/^/    ch: /'
summary+=("cloud-hypervisor without --allow-unsealed-dma: $verdict, CH exit $rc after ${wall} ms, flag named: $named")
kill "$sealed_pid" 2>/dev/null && wait "$sealed_pid" 2>/dev/null
sealed_pid=""

"$GPUVM" serve --socket-dir "$work/sock" --vms 2 --allow-unsealed-dma >"$work/serve.out" 2>"$work/serve.log" &
daemon_pid=$!
for _ in $(seq 1 300); do
    [ -S "$work/sock/vm0.sock" ] && [ -S "$work/sock/vm1.sock" ] && break
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
done
[ -S "$work/sock/vm1.sock" ] || { echo "gpuvm serve did not come up:"; cat "$work/serve.log"; exit 1; }

# The daemon's phase-mark lines of VM $1 logged after line $2 of serve.log, as
# "phase messages bar_reads bar_writes unmasks" (phase 0 = driver init, i = workload i).
marks() {
    tail -n +"$(( $2 + 1 ))" "$work/serve.log" | grep "\[$1\] phase mark" |
        sed -E 's/.*phase mark (0x[0-9a-f]+): since the previous mark ([0-9]+) messages: ([0-9]+) BAR reads, ([0-9]+) BAR writes, [0-9]+ config reads, [0-9]+ config writes, ([0-9]+) INTx unmasks.*/\1 \2 \3 \4 \5/'
}

# Prints the per-workload table of a guest console $1 with the daemon's marks $2. The guest
# writes mark p when phase p starts (0: driver init, 1+i: workload i, 0xff: done), and the
# daemon logs each mark with the messages since the previous one, so mark line 1 holds the
# bring-up before driver init (handshake, DMA map, IRQ setup, PCI enumeration), line 2 the
# driver init, and line i+3 workload i.
report_guest() {
    local console="$1" marksfile="$2"
    local row="    %-12s %10s %12s %12s %12s %12s\n"
    printf "$row" phase "time ms" "BAR reads" "BAR writes" "messages" "unmasks"
    msgs_of() { sed -n "${1}p" "$marksfile" | cut -d' ' -f"$2"; }
    printf "$row" "(bring-up)" "" "" "" "$(msgs_of 1 2)" "$(msgs_of 1 5)"
    local init
    init=$(grep -E "^driver up in" "$console")
    printf "$row" "driver init" \
        "$(echo "$init" | sed -E 's/^driver up in ([0-9]+) ms.*/\1/')" \
        "$(echo "$init" | sed -E 's/.*\(([0-9]+) BAR reads.*/\1/')" \
        "$(echo "$init" | sed -E 's/.* ([0-9]+) BAR writes\).*/\1/')" \
        "$(msgs_of 2 2)" "$(msgs_of 2 5)"
    local i=0
    while read -r line; do
        printf "$row" "$(echo "$line" | cut -d: -f1)" \
            "$(echo "$line" | sed -E 's/.*, ([0-9]+) ms, .*/\1/')" \
            "$(echo "$line" | sed -E 's/.* ([0-9]+) BAR reads.*/\1/')" \
            "$(echo "$line" | sed -E 's/.* ([0-9]+) BAR writes.*/\1/')" \
            "$(msgs_of $(( i + 3 )) 2)" "$(msgs_of $(( i + 3 )) 5)"
        i=$(( i + 1 ))
    done < <(grep -E "^[a-z_]+: [0-9]+ bytes" "$console")
    [ -s "$marksfile" ] || echo "    (no phase marks from the daemon)"
}

# Starts CH VM on socket $1 with irq mode $2, console $3; its pid in $ch_pid.
start_ch() {
    timeout "$ch_timeout" "$ch" --kernel "$GUEST" \
        --cmdline "size=$size workloads=$workloads irq=$2" \
        --memory size=256M,shared=on \
        --user-device "socket=$1" \
        --serial "file=$3" --console off --cpus boot=1 \
        >"$3.ch.log" 2>&1 &
    ch_pid=$!
    # VMM bring-up: from the launch to the guest's first console line (VM creation, vfio-user
    # handshake, DMA map, interrupt setup, loading the PVH image, the guest's ring-3 switch).
    local t0 pid=$ch_pid
    t0=$(now_ms)
    (
        while [ ! -s "$3" ] && kill -0 "$pid" 2>/dev/null; do sleep 0.01; done
        echo $(( $(now_ms) - t0 )) >"$3.first-line-ms"
    ) &
}

# Waits for CH pid $1 and checks console $2; $3 is the run's label, $4 its start (ms), $5 the VM
# name, $6 the serve.log line count at its start.
finish_ch() {
    local pid="$1" console="$2" label="$3" t0="$4" vm="$5" from="$6"
    wait "$pid"
    local rc=$?
    local wall=$(( $(now_ms) - t0 ))
    local verdict=FAIL
    grep -q "^PASS" "$console" && [ "$rc" -eq 0 ] && verdict=PASS
    [ "$verdict" = PASS ] || failures=$(( failures + 1 ))
    marks "$vm" "$from" >"$console.marks"
    # The console watcher ends within 10 ms of CH's exit.
    for _ in $(seq 1 100); do [ -e "$console.first-line-ms" ] && break; sleep 0.01; done
    local first
    first=$(cat "$console.first-line-ms" 2>/dev/null || echo "?")
    echo "== $label: $verdict (CH exit $rc, wall ${wall} ms, CH start to the guest's first line ${first} ms)"
    report_guest "$console" "$console.marks"
    grep -E "^(PASS|FAIL)|PANIC|FAILED|NOT VERIFIED|msi:" "$console" | sed 's/^/    /'
    summary+=("$label: $verdict, wall ${wall} ms, bring-up to the guest ${first} ms")
}

# 1. The reference: gpuvm's own KVM VMM, its vGPU on the same daemon.
for irq in "" "--irq"; do
    label="gpuvm run --kvm --vfio-user${irq:+ $irq}"
    args=()
    IFS=, read -ra ws <<<"$workloads"
    for w in "${ws[@]}"; do args+=(--workload "$w"); done
    t0=$(now_ms)
    if "$GPUVM" run --kvm --vfio-user "$work/sock/vm0.sock" --size "$size" "${args[@]}" $irq \
        --quiet-console >"$work/ref$irq.out" 2>&1; then v=PASS; else v=FAIL; failures=$(( failures + 1 )); fi
    wall=$(( $(now_ms) - t0 ))
    # The VMM's own bring-up: the process's wall time less the vCPU's (the report's "wall").
    vcpu=$(sed -nE 's/.*verified; wall ([0-9.]+) (ms|s);.*/\1 \2/p' "$work/ref$irq.out" |
        awk '{ printf "%d", $2 == "s" ? $1 * 1000 : $1 }')
    echo "== $label: $v (wall ${wall} ms, of which the vCPU ${vcpu:-?} ms)"
    sed 's/^/    /' "$work/ref$irq.out"
    summary+=("$label: $v, wall ${wall} ms, bring-up to the guest $(( wall - ${vcpu:-0} )) ms")
done

# 2. One CH VM, three interrupt modes.
for irq in poll intx msi; do
    from=$(wc -l <"$work/serve.log")
    t0=$(now_ms)
    start_ch "$work/sock/vm0.sock" "$irq" "$work/ch-$irq.console"
    finish_ch "$ch_pid" "$work/ch-$irq.console" "cloud-hypervisor, 1 VM, irq=$irq" "$t0" vm0 "$from"
done

# 3. Two CH VMs at once, sharing the GPU.
from=$(wc -l <"$work/serve.log")
t0=$(now_ms)
start_ch "$work/sock/vm0.sock" intx "$work/ch2-vm0.console"
pid0=$ch_pid
start_ch "$work/sock/vm1.sock" msi "$work/ch2-vm1.console"
pid1=$ch_pid
finish_ch "$pid0" "$work/ch2-vm0.console" "cloud-hypervisor, 2 VMs: vm0 irq=intx" "$t0" vm0 "$from"
finish_ch "$pid1" "$work/ch2-vm1.console" "cloud-hypervisor, 2 VMs: vm1 irq=msi" "$t0" vm1 "$from"

echo "== daemon: connections and per-connection messages"
grep -E "client connected|connection ended|request refused|restored VM" "$work/serve.log" | sed 's/^/    /'
echo "== summary"
printf '    %s\n' "${summary[@]}"
if [ "$failures" -ne 0 ]; then
    echo "$failures run(s) failed"
    exit 1
fi
echo "every run verified"
