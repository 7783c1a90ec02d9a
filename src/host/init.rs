//! Physical bring-up: the host is the GPU's only driver (as dom0's nouveau initialised the card
//! under GPUvm). It enables the units, initialises PFIFO the way the guest driver (and nouveau's
//! `gf100_fifo_init`) does, lays out its own structures in the hypervisor VRAM region, and binds
//! a host-owned BAR1 VM that maps the 128 physical USERD pages at physical BAR1 VA 0 — the
//! physical poll area, through which the host rings physical doorbells (a GP_PUT write through
//! BAR1 onto a bound channel's USERD page). Interrupts are enabled in PFIFO (all sources,
//! non-stall included) and PMC; the host services them itself.
//!
//! Host structures in hypervisor VRAM (all written with the VRAM backdoor):
//!
//! | Structure | Size |
//! |---|---|
//! | USERD pages of the 128 physical channels | 512 KiB |
//! | BAR1 instance block, page directory, small-page table | 4 KiB + 64 KiB + 256 KiB |
//! | an empty page directory (channels whose guest PDB is invalid point here: every access faults) | 64 KiB |
//! | two runlist buffers (double-buffered merged runlist) | 2 x 4 KiB |

use gf100::mmu::{self, Pde, PtRef, PtSize, Pte};
use gf100::{inst, pbus, pffb, pfifo, pmc, userd, Target};

use crate::addr::HostVram;
use crate::host::HostError;
use crate::layout::HostLayout;
use crate::phys::PhysicalGpu;
use crate::phys_driver::{phys_tlb_flush, wait_runlist};
use crate::vram_alloc::HypVram;

/// Bytes of one runlist buffer (128 entries of 8 bytes fit in one page).
const RUNLIST_BYTES: u64 = gf100::PAGE_SIZE;

/// Smallest hypervisor region: the host's own structures plus room for shadows.
pub(crate) const MIN_HYPERVISOR_VRAM: u64 = 16 << 20;

fn alloc(
    phys: &dyn PhysicalGpu,
    hyp: &mut HypVram,
    size: u64,
    what: &'static str,
) -> Result<HostVram, HostError> {
    let a = hyp
        .alloc(size, gf100::PAGE_SIZE)
        .ok_or(HostError::HypervisorVram { what })?;
    phys.fill_vram(HostVram(a), size, 0);
    Ok(HostVram(a))
}

fn wr64(phys: &dyn PhysicalGpu, addr: HostVram, v: u64) {
    phys.write_vram(addr, &v.to_le_bytes());
}

/// Brings the physical GPU up and lays out the host's structures.
pub(crate) fn bring_up(phys: &dyn PhysicalGpu, hyp: &mut HypVram) -> Result<HostLayout, HostError> {
    let boot0 = phys.read_reg(pmc::BOOT_0);
    if !pmc::boot0_is_fermi(boot0) {
        return Err(HostError::NotFermi { boot0 });
    }
    // nv50_mc_init: everything on, interrupts off until PFIFO is ready.
    phys.write_reg(pmc::ENABLE, pmc::ENABLE_ALL);
    phys.write_reg(pmc::INTR_EN_HOST, 0);
    // gf100_fb_init_page: 128 KiB large pages (what the shadows and the guests assume).
    let cfg = phys.read_reg(pffb::VM_CFG);
    phys.write_reg(pffb::VM_CFG, cfg & !pffb::VM_CFG_LARGE_PAGE_64K);

    let channels = u64::from(pfifo::CHANNELS);
    let layout = HostLayout {
        userd: alloc(phys, hyp, channels * userd::SIZE, "USERD pages")?,
        bar1_inst: alloc(phys, hyp, inst::SIZE, "BAR1 instance block")?,
        bar1_pd: alloc(phys, hyp, mmu::PD_SIZE, "BAR1 page directory")?,
        null_pd: alloc(phys, hyp, mmu::PD_SIZE, "empty page directory")?,
        runlists: [
            alloc(phys, hyp, RUNLIST_BYTES, "runlist")?,
            alloc(phys, hyp, RUNLIST_BYTES, "runlist")?,
        ],
        tlb_flush: Default::default(),
    };
    let bar1_spt = alloc(phys, hyp, mmu::SPT_SIZE, "BAR1 page table")?;

    // The host's BAR1 VM: PDE 0 -> one small-page table; PTE p -> USERD page of channel p.
    let pde = Pde {
        large: None,
        small: Some(PtRef {
            addr: bar1_spt.raw(),
            target: Target::Vram,
            vol: false,
        }),
        size: PtSize::Full,
    };
    wr64(phys, layout.bar1_pd, pde.encode());
    for p in 0..pfifo::CHANNELS {
        let pte = Pte::new(layout.userd_page(p).raw(), Target::Vram);
        let va = layout.userd_bar1(p);
        wr64(
            phys,
            bar1_spt.offset(mmu::spt_index(va) * mmu::ENTRY_SIZE),
            pte.encode(),
        );
    }
    wr64(
        phys,
        layout.bar1_inst.offset(inst::PDB_LO),
        inst::pdb_encode(layout.bar1_pd.raw(), Target::Vram),
    );
    wr64(
        phys,
        layout.bar1_inst.offset(inst::LIMIT_LO),
        gf100::pci::BAR1_SIZE - 1,
    );
    phys.write_reg(
        pbus::BAR1_INST,
        pbus::bar_inst_encode(layout.bar1_inst.raw(), Target::Vram),
    );
    phys_tlb_flush(phys, &layout.tlb_flush, layout.bar1_pd, true);

    // gf100_fifo_init, as the guest driver does it.
    phys.write_reg(pmc::SPOON_ENABLE, pfifo::SUBFIFO_ENABLE_ALL);
    phys.write_reg(pfifo::SUBFIFO_ENABLE, pfifo::SUBFIFO_ENABLE_ALL);
    let pbdmas = (phys.read_reg(pfifo::SUBFIFO_ENABLE) & ((1 << pfifo::PBDMAS) - 1)).count_ones();
    if pbdmas >= pfifo::PBDMAS {
        for (e, v) in pfifo::ENG_SUBFIFO_MASK_NOUVEAU.iter().enumerate() {
            phys.write_reg(pfifo::ENG_SUBFIFO_MASK + e as u32 * 4, *v);
        }
    }
    for i in 0..pbdmas {
        let halt = pfifo::pbdma(i, pfifo::PBDMA_INTR_HALT_MASK);
        phys.write_reg(
            halt,
            phys.read_reg(halt) & !pfifo::PBDMA_HALT_MASK_NOUVEAU_CLEAR,
        );
        phys.write_reg(pfifo::pbdma(i, pfifo::PBDMA_INTR), pfifo::INTR_CLEAR_ALL);
        phys.write_reg(
            pfifo::pbdma(i, pfifo::PBDMA_INTR_EN),
            pfifo::PBDMA_INTR_EN_NOUVEAU,
        );
    }
    phys.write_reg(pfifo::CTRL, phys.read_reg(pfifo::CTRL) | pfifo::CTRL_ENABLE);
    phys.write_reg(
        pfifo::USERD_POLL_BASE,
        pfifo::userd_poll_encode(layout.userd_bar1(0)),
    );
    // No channel bound, an empty runlist.
    for p in 0..pfifo::CHANNELS {
        phys.write_reg(pfifo::chan_state(p), 0);
        phys.write_reg(pfifo::chan_table(p), 0);
    }
    phys.write_reg(
        pfifo::RUNLIST_BASE,
        pfifo::runlist_base_encode(layout.runlists[0].raw(), Target::Vram),
    );
    phys.write_reg(pfifo::RUNLIST_SUBMIT, pfifo::RUNLIST_SUBMIT_UNK20);
    wait_runlist(phys);
    phys.write_reg(pfifo::INTR_RUNLIST, pfifo::INTR_RUNLIST_EVENT);
    phys.write_reg(pfifo::INTR, pfifo::INTR_CLEAR_ALL);
    phys.write_reg(
        pfifo::INTR_EN,
        pfifo::INTR_EN_DEFAULT | pfifo::INTR_NON_STALL,
    );
    phys.write_reg(pfifo::ENGINE_INTR_ENABLE, pfifo::ENGINE_INTR_ENABLE_NOUVEAU);
    phys.write_reg(pmc::INTR_EN_HOST, pmc::INTR_EN_HARDWARE);
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::phys::Bar;
    use gpuvm_sim::{SimConfig, SimGpu};

    #[test]
    fn bring_up_maps_the_userd_pages_at_bar1_zero() {
        let gpu = SimGpu::new(SimConfig {
            vram_size: 512 << 20,
            ..SimConfig::default()
        });
        let mut hyp = HypVram::immediate(0, 64 << 20);
        let l = bring_up(&gpu, &mut hyp).unwrap();
        // A write through the physical BAR1 lands in the USERD page of that channel.
        gpu.write_aperture(
            Bar::Bar1,
            l.userd_bar1(5) + userd::GP_PUT,
            &7u32.to_le_bytes(),
        );
        let mut b = [0u8; 4];
        gpu.read_vram(l.userd_page(5).offset(userd::GP_PUT), &mut b);
        assert_eq!(u32::from_le_bytes(b), 7);
        assert_eq!(gpu.stats().mmu_faults, 0);
        assert_eq!(gpu.stats().bad_register_writes, 0);
        assert_eq!(gpu.read_reg(pmc::INTR_EN_HOST), pmc::INTR_EN_HARDWARE);
        assert_eq!(
            gpu.read_reg(pfifo::INTR_EN),
            pfifo::INTR_EN_DEFAULT | pfifo::INTR_NON_STALL
        );
        assert_eq!(gpu.read_reg(pfifo::INTR), 0);
        assert!(hyp.used() < MIN_HYPERVISOR_VRAM);
    }
}
