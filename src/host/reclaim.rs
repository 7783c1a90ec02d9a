//! Releasing quarantined hypervisor VRAM: the second half of the in-flight-work protocol
//! (docs/isolation.md, "Work in flight"; the first half is `crate::channels::preempt`).
//!
//! Whatever the device model frees of the hypervisor VRAM (shadow page directories and tables,
//! shadow instance blocks) is retired with the physical channels that may still use it
//! (`crate::vram_alloc::HypVram`). After every service of the GPU, each such channel that is
//! off the GPU (no engine operation of it in flight, not resident in the middle of a GPFIFO
//! entry — a bound channel is preempted to find out, and reloads its context when it runs
//! again) is struck from the sets; a range no channel can reach any more is released, about
//! [`RELEASE_BUDGET`] bytes of them per call (the rest in the next calls). Before
//! the release, interrupts the GPU raised meanwhile are serviced, so a fault reported for a
//! retired instance block is still routed to the VM that ran the work (the block's address
//! leaves the VM's `retired_insts` only with the release), then the range is scrubbed: the
//! next user of that memory, of any VM, sees zeros.

use std::collections::BTreeSet;

use crate::addr::HostVram;
use crate::channels::preempt;
use crate::irq::IrqFlag;
use crate::phys::PhysicalGpu;

use super::HostState;

/// Bytes of quarantined hypervisor VRAM released (and scrubbed) per call, about: each release
/// zeroes its range under the host lock, and a neighbour churning shadow tables can leave
/// dozens of them (measured: 33 tables, 8 MiB, scrubbed in one 1.6 ms hold on the 2-core
/// machine, and the `exp lockhold` PV neighbour's longest hold 4 ms on 16 cores). What is left
/// goes in the next calls (one after every service). MODEL choice.
pub(crate) const RELEASE_BUDGET: u64 = 1 << 20;

/// Releases what no channel can reach any more, [`RELEASE_BUDGET`] bytes of it at a time;
/// returns the bytes released.
pub(crate) fn reclaim(st: &mut HostState, phys: &dyn PhysicalGpu, irq: &IrqFlag) -> u64 {
    if st.hyp.retired().is_empty() {
        return 0;
    }
    let chans: BTreeSet<u32> = st
        .hyp
        .retired()
        .iter()
        .flat_map(|r| r.chans.iter().copied())
        .collect();
    let busy = preempt::busy_channels(phys);
    let off: Vec<u32> = chans
        .into_iter()
        .filter(|&p| preempt::is_off(phys, p, &busy))
        .collect();
    if off.is_empty() && !st.hyp.has_unreachable() {
        return 0;
    }
    // Faults of the retired contexts were raised by now (their channels are off): route them
    // while the retired instance blocks are still known.
    if irq.is_asserted() {
        crate::host::irq_route::service(st, phys);
    }
    for p in off {
        st.hyp.strike(p);
    }
    let released = st.hyp.release_unreachable(RELEASE_BUDGET);
    let mut bytes = 0;
    for (addr, size) in released {
        phys.fill_vram(HostVram(addr), size, 0);
        for mut vm in st.vms.values_mut() {
            vm.retired_insts.retain(|r| r.shadow.raw() != addr);
        }
        bytes += size;
    }
    st.counters.hyp_released += bytes;
    bytes
}
