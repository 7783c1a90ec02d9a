//! Register sequences the host runs on the physical GPU as its only driver, shared by every
//! layer that touches the hardware: a TLB flush of one page directory, waiting for a runlist
//! update, submitting a runlist buffer. Each poll of a status register is bounded.

use gf100::{pffb, pfifo, Target};

use crate::addr::HostVram;
use crate::phys::PhysicalGpu;

/// Bounded polls of a physical status register before giving up (the simulator answers at
/// once; real hardware within microseconds).
const STATUS_POLLS: u32 = 1000;

/// Flushes the physical TLB for the page directory at `pd` (nouveau `gf100_vmm_invalidate`:
/// wait for a free flush slot, write the page directory, trigger, wait until queued), holding
/// `serial` (the host's `HostLayout::tlb_flush`) so that no other flush's registers come between.
pub(crate) fn phys_tlb_flush(
    phys: &dyn PhysicalGpu,
    serial: &parking_lot::Mutex<()>,
    pd: HostVram,
    hub_only: bool,
) {
    let _serial = serial.lock();
    let hub = if hub_only { pffb::FLUSH_HUB_ONLY } else { 0 };
    let (slot, queued) = phys.tlb_flush(
        pffb::vspace_encode(pd.raw(), Target::Vram),
        pffb::FLUSH_TRIGGER | pffb::FLUSH_PAGE_ALL | hub,
        STATUS_POLLS,
    );
    if !slot {
        log::warn!("physical TLB flush: no free flush slot");
    }
    if !queued {
        log::warn!("physical TLB flush of {pd} not acknowledged");
    }
}

/// Waits (bounded) for a physical runlist update to finish.
pub(crate) fn wait_runlist(phys: &dyn PhysicalGpu) {
    let ok = (0..STATUS_POLLS)
        .any(|_| phys.read_reg(pfifo::RUNLIST_RD_LEN) & pfifo::RUNLIST_PENDING == 0);
    if !ok {
        log::warn!("physical runlist update still pending");
    }
}

/// Writes the runlist of physical channels `entries` into the buffer at `buf`, submits it and
/// waits (bounded) for the update.
pub(crate) fn submit_runlist(phys: &dyn PhysicalGpu, buf: HostVram, entries: &[u32]) {
    let mut bytes = Vec::with_capacity(entries.len() * pfifo::RUNLIST_ENTRY_SIZE as usize);
    for &p in entries {
        bytes.extend_from_slice(&p.to_le_bytes());
        bytes.extend_from_slice(&pfifo::RUNLIST_ENTRY_WORD1.to_le_bytes());
    }
    phys.write_vram(buf, &bytes);
    phys.write_reg(
        pfifo::RUNLIST_BASE,
        pfifo::runlist_base_encode(buf.raw(), Target::Vram),
    );
    phys.write_reg(
        pfifo::RUNLIST_SUBMIT,
        pfifo::RUNLIST_SUBMIT_UNK20 | (entries.len() as u32 & pfifo::RUNLIST_LEN_MASK),
    );
    wait_runlist(phys);
}
