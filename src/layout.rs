//! Where the host keeps its own structures in the hypervisor VRAM region ([`HostLayout`]): the
//! USERD pages of the physical channels, its BAR1 VM, an all-absent page directory and the
//! runlist buffers. Laid out once by the host's bring-up; read by the channel code (USERD
//! pages, the null directory) and the merged runlist.

use std::sync::Arc;

use gf100::userd;

use crate::addr::HostVram;

/// Where the host's structures live in VRAM.
#[derive(Debug, Clone)]
pub(crate) struct HostLayout {
    /// USERD page of physical channel 0 (channel p at `+ p * 4 KiB`).
    pub userd: HostVram,
    /// The host's BAR1 instance block.
    pub bar1_inst: HostVram,
    /// The host's BAR1 page directory.
    pub bar1_pd: HostVram,
    /// An all-absent page directory.
    pub null_pd: HostVram,
    /// The two runlist buffers.
    pub runlists: [HostVram; 2],
    /// Held across each physical TLB flush (`phys_driver::phys_tlb_flush`): its registers are
    /// one GPU-wide sequence, which a VM's flush on the fast path runs without the host lock.
    pub tlb_flush: Arc<parking_lot::Mutex<()>>,
}

impl HostLayout {
    /// VRAM address of physical channel `p`'s USERD page.
    pub(crate) fn userd_page(&self, p: u32) -> HostVram {
        self.userd.offset(u64::from(p) * userd::SIZE)
    }

    /// Physical BAR1 offset of physical channel `p`'s USERD page.
    pub(crate) fn userd_bar1(&self, p: u32) -> u64 {
        u64::from(p) * userd::SIZE
    }
}
