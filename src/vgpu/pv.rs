//! The para-virtual page-table interface (`gf100::pv`, GPUvm's BAR4 "multicall",
//! GXEN `context_bar4.cc`), offered only to VMs whose profile says `shadow = "pv"`; for every
//! other VM its registers are unknown (the ID reads the bad-register code), so a guest driver
//! that probes it stays native.
//!
//! SUBMIT reads BATCH_COUNT ops (at most `MAX_BATCH`, else `ERR_BAD_BATCH`) of `OP_SIZE` bytes from
//! guest RAM at BATCH_LO/HI through the VM's memory check, hands them to
//! [`crate::shadow_pt::ShadowPt::pv_apply`] (which writes each entry into the guest's table and
//! its shadow), flushes the physical TLB for the shadow page directories it names, and sets
//! STATUS (ops applied) and ERROR (first rejected op's error).

use gf100::pv::{self as iface, Op};
use gf100::Target;

use crate::profile::ShadowMode;
use crate::vgpu::{ViolationKind, VmCx};

fn offered(cx: &VmCx) -> bool {
    cx.vm.profile.shadow == ShadowMode::Pv
}

/// A read of the interface; `None` = unknown register.
pub(crate) fn read(cx: &mut VmCx, off: u32) -> Option<u32> {
    if !offered(cx) {
        return None;
    }
    let r = &cx.vm.regs.pv;
    Some(match off {
        iface::ID => iface::MAGIC,
        iface::BATCH_LO => r.batch_lo,
        iface::BATCH_HI => r.batch_hi,
        iface::BATCH_COUNT => r.count,
        iface::SUBMIT => 0,
        iface::STATUS => r.status,
        iface::ERROR => r.error,
        _ => return None,
    })
}

/// A write of the interface; false = unknown register.
pub(crate) fn write(cx: &mut VmCx, off: u32, v: u32) -> bool {
    if !offered(cx) {
        return false;
    }
    let r = &mut cx.vm.regs.pv;
    match off {
        iface::BATCH_LO => r.batch_lo = v,
        iface::BATCH_HI => r.batch_hi = v,
        iface::BATCH_COUNT => r.count = v,
        iface::SUBMIT => {
            if v != 0 {
                submit(cx);
            }
        }
        iface::ID | iface::STATUS | iface::ERROR => {}
        _ => return false,
    }
    true
}

fn submit(cx: &mut VmCx) {
    cx.vm.stats.pv_batches += 1;
    let r = cx.vm.regs.pv;
    let gpa = u64::from(r.batch_hi) << 32 | u64::from(r.batch_lo);
    cx.vm.regs.pv.status = 0;
    if r.count > iface::MAX_BATCH {
        cx.vm.regs.pv.error = iface::ERR_BAD_BATCH;
        let n = r.count;
        cx.violation(ViolationKind::PvBatch, || {
            format!("PV batch of {n} ops (at most {})", iface::MAX_BATCH)
        });
        return;
    }
    let mut bytes = vec![0u8; r.count as usize * iface::OP_SIZE as usize];
    if let Err(v) = cx.gmem().read(Target::SysCoherent, gpa, &mut bytes) {
        cx.vm.regs.pv.error = iface::ERR_BAD_BATCH;
        cx.violation(ViolationKind::PvBatch, || {
            format!("PV batch at {gpa:#x}: {v}")
        });
        return;
    }
    let ops: Vec<Op> = bytes
        .chunks_exact(iface::OP_SIZE as usize)
        .map(|c| {
            let mut b = [0u8; iface::OP_SIZE as usize];
            b.copy_from_slice(c);
            Op::from_bytes(&b)
        })
        .collect();
    // Read before the batch: an op that rewrites a BAR page directory entry names the
    // directory, which is in this set.
    let bar_tables = crate::vgpu::aperture::bar_tables(cx);
    let outcome = {
        let (sh, mut scx) = cx.shadow();
        sh.pv_apply(&mut scx, &ops)
    };
    cx.phys_tlb_flush(&outcome.flush);
    cx.vm.regs.pv.status = outcome.applied;
    cx.vm.regs.pv.error = outcome.error;
    // The ops wrote guest memory: instance blocks and BAR page tables may have changed.
    crate::channels::refresh_all(&mut cx.chan());
    cx.vm.bars.flush();
    // The direct-map plans a VMM maps change only if a BAR's own tables were written. Moving
    // their generation for every batch made a KVM VMM re-plan after each one (pv ran 88
    // remaps per run against fv's 24, and came out slower than fv).
    let hits_bars = ops
        .iter()
        .any(|o| Target::from_bits(o.target).is_none_or(|t| bar_tables.contains(&(o.table, t))));
    if hits_bars {
        cx.vm.map_gen += 1;
    }
}
