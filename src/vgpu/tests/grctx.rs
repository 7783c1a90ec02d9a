//! Host-owned GR contexts (`crate::channels::grctx`): whatever a guest puts in its instance
//! block's GR context pointer, its context buffer or its page directory, the pointer the
//! hardware is given names a context the host built from its golden image, in hypervisor VRAM,
//! and it goes through the quarantine when the channel is unbound. In every shadow mode.

use super::*;
use crate::shadow_pt::hyp::{HYP_PDE, HYP_VA_BASE};
use crate::shadow_pt::GuestPdb;

/// Guest addresses of `guest_channel`: instance block, page directory, small page table.
const INST: u64 = 0x1_0000;
const PD: u64 = 0x2_0000;
const PT: u64 = 0x10_0000;
/// The guest's own context buffer (guest VRAM) and the VA it maps it at.
const CTX: u64 = 0x20_0000;
const CTX_VA: u64 = 0x0600_0000;

fn u32_at(gpu: &SimGpu, at: HostVram) -> u32 {
    let mut b = [0u8; 4];
    gpu.read_vram(at, &mut b);
    u32::from_le_bytes(b)
}

/// (shadow instance block, host context, guest PDB) of guest channel `g`.
fn bound(v: &Vgpu, g: u32) -> (HostVram, Option<HostVram>, GuestPdb) {
    v.port
        .peek(v.id, |cx| {
            let b = cx.vm.chans[g as usize].bound.as_ref().expect("bound");
            (b.shadow_inst, b.grctx, b.pdb.expect("valid PDB"))
        })
        .unwrap()
}

/// Where `va` leads through the shadow of `pdb`.
fn through_shadow(v: &Vgpu, pdb: GuestPdb, va: u64) -> Option<crate::shadow_pt::ShadowTranslation> {
    v.port
        .peek(v.id, |cx| {
            let (sh, scx) = cx.shadow();
            sh.translate(&scx, pdb, va)
        })
        .unwrap()
}

fn flush(v: &Vgpu) {
    wr(
        v,
        pffb::TLB_FLUSH_VSPACE,
        pffb::vspace_encode(PD, Target::Vram),
    );
    wr(
        v,
        pffb::TLB_FLUSH_TRIGGER,
        pffb::FLUSH_TRIGGER | pffb::FLUSH_PAGE_ALL | pffb::FLUSH_HUB_ONLY,
    );
    // Lazy mode rebuilds before the next submission; resync stands in for it here.
    v.port.peek(v.id, |cx| {
        let (sh, mut scx) = cx.shadow();
        sh.resync(&mut scx, None)
    });
}

#[test]
fn gr_contexts_are_host_owned_in_every_shadow_mode() {
    for mode in [
        ShadowMode::Eager,
        ShadowMode::Lazy,
        ShadowMode::Incremental,
        ShadowMode::Pv,
    ] {
        let r = rig();
        let a = r.vm(mode);
        let b = r.vm(mode);
        // The other VM's memory, to check it stays as it is.
        pramin_wr(&b, 0x1000, &[0x5a; 64]);
        let b_before: Vec<u32> = (0..16).map(|i| pramin_rd(&b, 0x1000 + i * 4)).collect();

        // A's channel 0, its page table mapping the guest's own context buffer at CTX_VA.
        guest_channel(&a, 0, None);
        for i in 0..(0x2_0000 / 0x1000) {
            pramin_wr64(
                &a,
                PT + mmu::spt_index(CTX_VA + i * 0x1000) * mmu::ENTRY_SIZE,
                Pte::new(CTX + i * 0x1000, Target::Vram).encode(),
            );
        }
        // A malicious context: a patch list of 4 pairs aimed at PFIFO's channel table and at
        // PMC, as FECS would execute them on the next load.
        pramin_wr(&a, CTX + inst::GRCTX_MMIO_COUNT, &4u32.to_le_bytes());
        pramin_wr(
            &a,
            CTX + inst::GRCTX_MMIO_LIST,
            &((CTX_VA + 0x1000) >> 8).to_le_bytes(),
        );
        for (i, (reg, val)) in [
            (0x3000u32, 0xdead_0001u32),
            (0x3004, 0xdead_0002),
            (0x200, 0),
            (0x1700, 0x1),
        ]
        .iter()
        .enumerate()
        {
            pramin_wr(&a, CTX + 0x1000 + i as u64 * 8, &reg.to_le_bytes());
            pramin_wr(&a, CTX + 0x1000 + i as u64 * 8 + 4, &val.to_le_bytes());
        }
        // The guest names its context, as nouveau does (VA | 4) — after the bind, so the
        // write-tracked refresh path builds the pointer.
        pramin_wr(
            &a,
            INST + inst::GR_CTX,
            &((CTX_VA as u32) | inst::GR_CTX_VALID).to_le_bytes(),
        );
        pramin_wr(&a, INST + inst::GR_CTX + 4, &0u32.to_le_bytes());
        flush(&a);

        let (shadow_inst, ctx, pdb) = bound(&a, 0);
        let ctx = ctx.unwrap_or_else(|| panic!("{mode:?}: no host context"));
        let lo = u32_at(&r.gpu, shadow_inst.offset(inst::GR_CTX));
        let hi = u32_at(&r.gpu, shadow_inst.offset(inst::GR_CTX + 4));
        let va = u64::from(hi) << 32 | u64::from(lo & !0xfff);
        assert_ne!(lo & inst::GR_CTX_VALID, 0, "{mode:?}");
        assert_eq!(
            va, HYP_VA_BASE,
            "{mode:?}: slot 0 of the hypervisor's range"
        );
        assert_ne!(va, CTX_VA);
        // The shadow VM maps it onto the host context, supervisor-only; the guest's buffer is
        // reachable only at its own VA (through its own shadowed PTEs).
        let t = through_shadow(&a, pdb, va).unwrap_or_else(|| panic!("{mode:?}: unmapped"));
        assert_eq!((t.target, t.addr), (Target::Vram, ctx.raw()), "{mode:?}");
        assert!(
            t.supervisor,
            "{mode:?}: the guest's channels cannot reach it"
        );
        for v in [&a, &b] {
            let s = v.vram_slice();
            assert!(
                ctx.raw() + u64::from(crate::mmio::vpgraph::CONTEXT_SIZE) <= s.base.raw()
                    || ctx.raw() >= s.base.raw() + s.size,
                "{mode:?}: the context is in no VM's slice"
            );
        }
        // Its contents are the host golden context: the guest's patch list is not there.
        let mut img = vec![0u8; crate::mmio::vpgraph::CONTEXT_SIZE as usize];
        r.gpu.read_vram(ctx, &mut img);
        assert_eq!(img, crate::channels::grctx::golden(), "{mode:?}");
        assert_eq!(u32_at(&r.gpu, ctx.offset(inst::GRCTX_MMIO_COUNT)), 0);
        assert_eq!(a.stats().gr_contexts, 1);

        // A page-table at the hypervisor's PDE is refused and the host's mapping stays.
        pramin_wr64(
            &a,
            PD + u64::from(HYP_PDE) * mmu::ENTRY_SIZE,
            Pde {
                large: None,
                small: Some(PtRef {
                    addr: PT,
                    target: Target::Vram,
                    vol: false,
                }),
                size: PtSize::Full,
            }
            .encode(),
        );
        flush(&a);
        let t = through_shadow(&a, pdb, va).unwrap();
        assert_eq!(
            t.addr,
            ctx.raw(),
            "{mode:?}: the guest cannot take the range over"
        );
        assert!(a.stats().shadow.hyp_pde_refused >= 1, "{mode:?}");

        // Clearing the pointer clears the shadow's; the context stays with the channel.
        pramin_wr(&a, INST + inst::GR_CTX, &0u32.to_le_bytes());
        assert_eq!(
            u32_at(&r.gpu, shadow_inst.offset(inst::GR_CTX)),
            0,
            "{mode:?}"
        );
        pramin_wr(
            &a,
            INST + inst::GR_CTX,
            &((CTX_VA as u32) | inst::GR_CTX_VALID).to_le_bytes(),
        );
        assert_eq!(bound(&a, 0).1, Some(ctx), "{mode:?}: the same context");
        assert_eq!(a.stats().gr_contexts, 1);

        // Unbinding unmaps it and frees it through the quarantine, which scrubs it when it
        // releases it (once the channel is off the GPU). Mark it as a context switch would
        // have left it, to see the scrub.
        r.gpu.write_vram(ctx.offset(0x1000), &[0xc3; 64]);
        let released = r.host.stats().hypervisor_vram_released;
        wr(&a, pfifo::chan_table(0), 0);
        r.run_for(1_000_000);
        assert!(
            r.host.stats().hypervisor_vram_released
                >= released + u64::from(crate::mmio::vpgraph::CONTEXT_SIZE),
            "{mode:?}: released through the quarantine"
        );
        assert_eq!(u32_at(&r.gpu, ctx.offset(0x1000)), 0, "{mode:?}: scrubbed");
        assert_eq!(through_shadow(&a, pdb, va), None, "{mode:?}: unmapped");

        // B's memory is as it was.
        let b_after: Vec<u32> = (0..16).map(|i| pramin_rd(&b, 0x1000 + i * 4)).collect();
        assert_eq!(b_before, b_after, "{mode:?}");
    }
}

#[test]
fn a_channel_without_a_gr_context_gets_none() {
    let r = rig();
    let a = r.vm(ShadowMode::Lazy);
    guest_channel(&a, 0, None);
    let (shadow_inst, ctx, _) = bound(&a, 0);
    assert_eq!(ctx, None);
    assert_eq!(u32_at(&r.gpu, shadow_inst.offset(inst::GR_CTX)), 0);
    assert_eq!(a.stats().gr_contexts, 0);
}
