//! Host-owned GR contexts (`shared/research/gf100-pgraph-ctxsw.md` §5.2, "keep contexts
//! host-owned"; GVT-g's shadow contexts for i915).
//!
//! On GF100 a channel's GR context image and its patch list live in memory the driver owns;
//! FECS reloads the image on every switch-in and executes the patch list (header word 0/1) as
//! register writes with no address filter. A shadow instance block that carried the guest's
//! context pointer (instance offset 0x210) through — as GPUvm did — would let a guest load any
//! GR register state, and through the patch list write registers outside PGRAPH, on the shared
//! engine.
//!
//! Here the shadow instance block's 0x210/0x214 never carries the guest's value. When the
//! guest's block names a valid context (0x210 bit 2), the device model gives the channel a
//! context of its own in hypervisor VRAM, initialized from the **host golden context**
//! ([`golden`]), mapped supervisor-only in the hypervisor's reserved range of every shadow
//! address space of the VM (`crate::shadow_pt::hyp`, slot = guest channel), and points the
//! shadow's 0x210/0x214 at it (the VM limit in the shadow is then the full 40 bits so the range
//! is addressable). **Guest context contents are not copied in at all**: nouveau never reads a
//! channel context back after creating it, and golden contents a guest computed (or a patch
//! list it wrote) are ignored. A guest that clears its pointer gets a shadow pointer of 0; the
//! context is kept until the channel is unbound, then unmapped, scrubbed and freed through the
//! hypervisor VRAM quarantine (`crate::vram_alloc::HypVram`, released by `host::reclaim` once
//! the channel is off the GPU).
//!
//! Emulation level: the golden context is a header with an empty patch list and a zero body.
//! The simulated GF100 has no FECS to take a golden save from and does not context-switch GR,
//! so nothing reads these contexts yet; on a physical GPU (VFIO) the host would capture its
//! golden image from its own FECS (not implemented). What is real: no guest-written byte is
//! reachable through any pointer the hardware is given.

use std::sync::OnceLock;

use gf100::{inst, mmu};

use super::view::ChanCx;
use crate::addr::HostVram;
use crate::mmio::vpgraph::CONTEXT_SIZE;

// One context is one large page of the hypervisor's range.
const _: () = assert!(CONTEXT_SIZE as u64 == mmu::LARGE_PAGE_SIZE);

/// The host golden context: an empty patch list (header word 0 = 0 pairs, word 1 = no list)
/// and a zero register/strand body.
pub(crate) fn golden() -> &'static [u8] {
    static GOLDEN: OnceLock<Vec<u8>> = OnceLock::new();
    GOLDEN.get_or_init(|| {
        let mut img = vec![0u8; CONTEXT_SIZE as usize];
        let put = |img: &mut [u8], off: u64, v: u32| {
            img[off as usize..off as usize + 4].copy_from_slice(&v.to_le_bytes());
        };
        put(&mut img, inst::GRCTX_MMIO_COUNT, 0);
        put(&mut img, inst::GRCTX_MMIO_LIST, 0);
        img
    })
}

/// The guest's GR context pointer (VA), if its block marks one valid.
fn guest_pointer(block: &[u8]) -> Option<u64> {
    let at = inst::GR_CTX as usize;
    let lo = u32::from_le_bytes(block[at..at + 4].try_into().ok()?);
    let hi = u32::from_le_bytes(block[at + 4..at + 8].try_into().ok()?);
    (lo & inst::GR_CTX_VALID != 0).then_some(u64::from(hi) << 32 | u64::from(lo & !0xfff))
}

/// Fills the GR context pointer of the shadow block `sh` of guest channel `g` from the guest's
/// `block`: the host-owned context's VA if the guest names one, else 0. Returns true if a
/// host context is attached (the shadow's VM limit must then cover the hypervisor's range).
pub(crate) fn shadow_pointer(cx: &mut ChanCx, g: u32, block: &[u8], sh: &mut [u8]) -> bool {
    let at = inst::GR_CTX as usize;
    sh[at..at + 8].fill(0);
    if guest_pointer(block).is_none() {
        return false;
    }
    let Some(va) = ensure(cx, g) else {
        return false;
    };
    let lo = (va as u32) | inst::GR_CTX_VALID;
    sh[at..at + 4].copy_from_slice(&lo.to_le_bytes());
    sh[at + 4..at + 8].copy_from_slice(&((va >> 32) as u32).to_le_bytes());
    true
}

/// The VA of channel `g`'s host context, allocating and mapping it on first use.
fn ensure(cx: &mut ChanCx, g: u32) -> Option<u64> {
    let gi = g as usize;
    let existing = cx.vm.chans[gi].bound.as_ref().and_then(|b| b.grctx);
    let page = match existing {
        Some(p) => p,
        None => {
            let page = {
                let (sh, mut scx) = cx.shadow();
                sh.alloc_hyp_page(&mut scx)
            };
            let Some(page) = page else {
                log::error!(
                    "{}: channel {g}: no hypervisor VRAM for a GR context; the shadow names none",
                    cx.vm.id
                );
                return None;
            };
            cx.phys.write_vram(page, golden());
            if let Some(b) = cx.vm.chans[gi].bound.as_mut() {
                b.grctx = Some(page);
            }
            cx.vm.stats.gr_contexts += 1;
            page
        }
    };
    let (sh, mut scx) = cx.shadow();
    sh.map_hyp_page(&mut scx, g, Some(page))
}

/// Channel `g` is being unbound: unmaps, scrubs and frees (through the quarantine) its host
/// context, if it has one.
pub(crate) fn release(cx: &mut ChanCx, g: u32, page: Option<HostVram>) {
    let Some(page) = page else {
        return;
    };
    let pds = {
        let (sh, mut scx) = cx.shadow();
        sh.map_hyp_page(&mut scx, g, None);
        sh.shadow_pds()
    };
    cx.phys_tlb_flush(&pds);
    cx.phys.fill_vram(page, mmu::LARGE_PAGE_SIZE, 0);
    let (sh, mut scx) = cx.shadow();
    sh.free_hyp_page(&mut scx, page);
}
