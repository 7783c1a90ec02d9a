//! BAR0, the register BAR (GPUvm `context_bar0.cc`, but deny by default): every access is
//! looked up in the region table (`crate::mmio::regions`) and dispatched on its handler. An
//! offset no region covers, a denied region, or a register a handler does not implement reads
//! `gf100::BAD_REGISTER` and drops writes; all are counted (writes to denied regions also as
//! violations) and nothing ever reaches the physical GPU unless a handler forwards it.
//!
//! Widths: registers are 32-bit; an aligned 8-byte access is two registers (low first); 1- and
//! 2-byte reads return part of the containing register; 1- and 2-byte writes to registers and
//! unaligned accesses are dropped (counted as `BadAccess`), because a partial write to a
//! register with side effects has no defined meaning. The PRAMIN window takes every width.
//!
//! What the guest sees, register by register, is documented in `docs/design.md` ("Virtual
//! GPU"); the highlights: FB sizing reports one partition holding the VM's slice; PTIMER is
//! forwarded read-only; PMC/PFIFO interrupts are the VM's own ([`super::vregs`]); a TLB flush
//! drives the shadow page tables and flushes the physical TLB for each shadow that changed.

use gf100::{pbus, pfb, pffb, pfifo, pmc, ptimer};

use crate::layout::HostLayout;
use crate::mmio::regions::{lookup, Handler, Policy};
use crate::phys::PhysicalGpu;
use crate::shadow_pt::GuestPdb;
use crate::vgpu::{aperture, pv, ViolationKind, VmCx, VmState};

/// Frame-buffer partitions the virtual GPU reports: one, holding the whole slice.
const VIRTUAL_FBPS: u32 = 1;

/// How an access was classified, for the exit counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Policy(Policy),
    Unknown,
}

fn count(cx: &mut VmCx, class: Class, write: bool) {
    count_vm(cx.vm, class, write);
}

fn count_vm(vm: &mut VmState, class: Class, write: bool) {
    let c = &mut vm.stats.by_class;
    match class {
        Class::Policy(p) => c.policy_mut(p).count(write),
        Class::Unknown => c.unknown.count(write),
    }
}

/// A guest BAR0 read.
pub(crate) fn read(cx: &mut VmCx, offset: u64, data: &mut [u8]) {
    let len = data.len();
    if let Some(off) = pramin_offset(offset, len) {
        count(cx, Class::Policy(Policy::Shadowed), false);
        aperture::pramin_read(cx, off, data);
        return;
    }
    let Ok(off) = u32::try_from(offset) else {
        count(cx, Class::Unknown, false);
        data.fill(0xff);
        return;
    };
    match len {
        4 | 8 if off % 4 == 0 => {
            let (v, class) = read32(cx, off);
            count(cx, class, false);
            data[..4].copy_from_slice(&v.to_le_bytes());
            if len == 8 {
                let (hi, _) = read32(cx, off.wrapping_add(4));
                data[4..].copy_from_slice(&hi.to_le_bytes());
            }
        }
        1 | 2 if (off % 4) as usize + len <= 4 => {
            let (v, class) = read32(cx, off & !3);
            count(cx, class, false);
            let b = v.to_le_bytes();
            let o = (off % 4) as usize;
            data.copy_from_slice(&b[o..o + len]);
        }
        _ => {
            count(cx, Class::Unknown, false);
            data.fill(0xff);
            cx.violation(ViolationKind::BadAccess, || {
                format!("BAR0 read of {len} bytes at {offset:#x}")
            });
        }
    }
}

/// A guest BAR0 read that involves only the VM's own state (and the GPU's clock), done
/// without the host's context: the fast path of `host::local`, taken with only this VM's lock.
/// Returns false, having changed nothing, where the read needs more (the PRAMIN window, the
/// channel table, the para-virtual interface, a malformed access to be logged): the caller
/// then takes the host lock and does it the usual way ([`read`]), with the same result.
pub(crate) fn read_fast(
    phys: &dyn PhysicalGpu,
    vm: &mut VmState,
    offset: u64,
    data: &mut [u8],
) -> bool {
    let len = data.len();
    if pramin_offset(offset, len).is_some() {
        return false;
    }
    let Ok(off) = u32::try_from(offset) else {
        return false;
    };
    let (reg, shift) = match len {
        4 | 8 if off % 4 == 0 => (off, 0),
        1 | 2 if (off % 4) as usize + len <= 4 => (off & !3, (off % 4) as usize),
        _ => return false,
    };
    let Some((lo, class)) = read32_local(phys, vm, reg) else {
        return false;
    };
    let hi = if len == 8 {
        match read32_local(phys, vm, reg.wrapping_add(4)) {
            Some((v, _)) => v,
            None => return false,
        }
    } else {
        0
    };
    count_vm(vm, class, false);
    if len == 8 {
        data[..4].copy_from_slice(&lo.to_le_bytes());
        data[4..].copy_from_slice(&hi.to_le_bytes());
    } else {
        data.copy_from_slice(&lo.to_le_bytes()[shift..shift + len]);
    }
    true
}

/// One register read on the fast path; `None` where it needs the host's context.
fn read32_local(phys: &dyn PhysicalGpu, vm: &mut VmState, off: u32) -> Option<(u32, Class)> {
    let Some(region) = lookup(off) else {
        return Some((gf100::BAD_REGISTER, Class::Unknown));
    };
    let Some(handler) = region.handler else {
        return Some((gf100::BAD_REGISTER, Class::Policy(Policy::Denied)));
    };
    match read_local(phys, vm, handler, off) {
        Local::Value(Some(v)) => Some((v, Class::Policy(region.policy))),
        Local::Value(None) => Some((gf100::BAD_REGISTER, Class::Unknown)),
        Local::NeedsHost => None,
    }
}

/// A guest BAR0 write with only the VM's state (the fast path, `host::local`): a write of the
/// PRAMIN window that reaches only the VM's memory and page tables
/// (`aperture::pramin_write_fast`), or a 32-bit write of a register that only stores its value
/// (`write_local`). False, nothing done, for anything else.
pub(crate) fn write_fast(
    phys: &dyn PhysicalGpu,
    layout: &HostLayout,
    vm: &mut VmState,
    offset: u64,
    data: &[u8],
) -> bool {
    let class = if let Some(off) = pramin_offset(offset, data.len()) {
        if !aperture::pramin_write_fast(phys, vm, off, data) {
            return false;
        }
        Class::Policy(Policy::Shadowed)
    } else {
        let (Ok(word), Ok(off)) = (<[u8; 4]>::try_from(data), u32::try_from(offset)) else {
            return false;
        };
        let Some(region) = lookup(off).filter(|_| off % 4 == 0) else {
            return false;
        };
        let v = u32::from_le_bytes(word);
        match region.handler {
            Some(Handler::TlbFlushTrigger)
                if v & pffb::FLUSH_TRIGGER != 0 && tlb_flush_local(phys, layout, vm, v) =>
            {
                Class::Policy(region.policy)
            }
            Some(h) if write_local(vm, h, off, v) => Class::Policy(region.policy),
            _ => return false,
        }
    };
    count_vm(vm, class, true);
    vm.stats.exits.bar0.count(true);
    vm.stats.local_writes += 1;
    true
}

/// A guest BAR0 write.
pub(crate) fn write(cx: &mut VmCx, offset: u64, data: &[u8]) {
    let len = data.len();
    if let Some(off) = pramin_offset(offset, len) {
        count(cx, Class::Policy(Policy::Shadowed), true);
        aperture::pramin_write(cx, off, data);
        return;
    }
    let Ok(off) = u32::try_from(offset) else {
        count(cx, Class::Unknown, true);
        return;
    };
    match len {
        4 | 8 if off % 4 == 0 => {
            let lo = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
            let class = write32(cx, off, lo);
            count(cx, class, true);
            if len == 8 {
                let hi = u32::from_le_bytes([data[4], data[5], data[6], data[7]]);
                write32(cx, off.wrapping_add(4), hi);
            }
        }
        // Byte writes a driver does on hardware: the VGA CRTC ports (nouveau's wrvgac) and the
        // MSI re-arm byte (nouveau's `nvkm_pci_msi_rearm` writes 1 byte to 0x088704).
        1 | 2 if (off % 4) as usize + len <= 4 => match lookup(off).and_then(|r| r.handler) {
            Some(Handler::VgaPorts) if cx.vm.regs.board.write_partial(off, data) => {
                count(cx, Class::Policy(Policy::Virtual), true);
            }
            Some(Handler::MsiRearm) => count(cx, Class::Policy(Policy::Virtual), true),
            _ => {
                count(cx, Class::Unknown, true);
                cx.violation(ViolationKind::BadAccess, || {
                    format!("BAR0 write of {len} bytes at {offset:#x}")
                });
            }
        },
        _ => {
            count(cx, Class::Unknown, true);
            cx.violation(ViolationKind::BadAccess, || {
                format!("BAR0 write of {len} bytes at {offset:#x}")
            });
        }
    }
}

/// The PRAMIN window offset of an access that lies entirely inside the window.
fn pramin_offset(offset: u64, len: usize) -> Option<u64> {
    let base = u64::from(pbus::PRAMIN_BASE);
    let rel = offset.checked_sub(base)?;
    (aperture::valid_width(len) && rel + len as u64 <= u64::from(pbus::PRAMIN_SIZE)).then_some(rel)
}

/// Reads one register.
fn read32(cx: &mut VmCx, off: u32) -> (u32, Class) {
    let Some(region) = lookup(off) else {
        return (gf100::BAD_REGISTER, Class::Unknown);
    };
    let Some(handler) = region.handler else {
        return (gf100::BAD_REGISTER, Class::Policy(Policy::Denied));
    };
    match read_handler(cx, handler, off) {
        Some(v) => (v, Class::Policy(region.policy)),
        None => (gf100::BAD_REGISTER, Class::Unknown),
    }
}

/// Writes one register.
fn write32(cx: &mut VmCx, off: u32, v: u32) -> Class {
    let Some(region) = lookup(off) else {
        return Class::Unknown;
    };
    let Some(handler) = region.handler else {
        let name = region.name;
        cx.violation(ViolationKind::DeniedRegister, || {
            format!("write of {v:#010x} to denied {name} ({off:#08x})")
        });
        return Class::Policy(Policy::Denied);
    };
    if write_handler(cx, handler, off, v) {
        Class::Policy(region.policy)
    } else {
        Class::Unknown
    }
}

/// Index of a 4-byte register in an array starting at `base`.
fn index(off: u32, base: u32) -> usize {
    ((off - base) / 4) as usize
}

fn read_handler(cx: &mut VmCx, h: Handler, off: u32) -> Option<u32> {
    match h {
        Handler::Pramin => {
            let mut b = [0u8; 4];
            aperture::pramin_read(cx, u64::from(off - pbus::PRAMIN_BASE), &mut b);
            Some(u32::from_le_bytes(b))
        }
        Handler::ChannelTable => {
            let (g, state) = crate::channels::table_index(off)?;
            Some(crate::channels::table_read(&mut cx.chan(), g, state))
        }
        Handler::Paravirt => pv::read(cx, off),
        _ => match read_local(cx.phys, cx.vm, h, off) {
            Local::Value(v) => v,
            Local::NeedsHost => None,
        },
    }
}

/// What a register read of the VM's own state gave.
enum Local {
    /// The value (`None`: not implemented).
    Value(Option<u32>),
    /// The handler needs the host's context (`read_handler`).
    NeedsHost,
}

/// The registers whose reads involve only the VM's state and the GPU's clock.
fn read_local(phys: &dyn PhysicalGpu, vm: &mut VmState, h: Handler, off: u32) -> Local {
    let r = &mut vm.regs;
    Local::Value(Some(match h {
        Handler::Boot0 => pmc::BOOT_0_QUADRO_6000,
        Handler::Endian => 0,
        Handler::PmcIntr => match off {
            pmc::INTR_HOST => r.pmc_intr(),
            _ => 0,
        },
        Handler::PmcIntrEn => match off {
            pmc::INTR_EN_HOST => r.pmc_intr_en_host,
            _ => r.pmc_intr_en_nrhost,
        },
        Handler::PmcEnable => match off {
            pmc::ENABLE => r.pmc_enable,
            _ => r.spoon_enable,
        },
        Handler::PmcIntrMask => r.pmc_mask,
        Handler::MsiRearm | Handler::Pflush | Handler::TlbFlushTrigger => 0,
        Handler::PciMirror => {
            let mut b = [0u8; 4];
            let at = u16::try_from(off - gf100::pci::BAR0_MIRROR).unwrap_or(u16::MAX);
            vm.pci.read(at, &mut b);
            u32::from_le_bytes(b)
        }
        Handler::PraminBase => r.pmem,
        Handler::BarInst => match off {
            pbus::BAR1_INST => r.bar1_inst,
            _ => r.bar3_inst,
        },
        Handler::Pramin | Handler::ChannelTable | Handler::Paravirt => return Local::NeedsHost,
        Handler::FbSize => match off {
            pfb::FBP_COUNT => VIRTUAL_FBPS,
            pfb::FBP_DISABLE_MASK => 0,
            o if o == pfb::fbpa_amount(0) => u32::try_from(vm.profile.vram_mib).unwrap_or(u32::MAX),
            _ => 0,
        },
        Handler::SysmemFlushPage => r.sysmem_flush_page,
        Handler::VmCfg => {
            // No free flush slot while a shadow rebuild is in progress: a guest that flushes
            // again waits for it (each of its polls is an exit that does a step of it).
            let slots = if vm.shadow.rebuilding() {
                0
            } else {
                pffb::VM_CFG_FLUSH_SLOTS_MASK
            };
            (r.vm_cfg & pffb::VM_CFG_LARGE_PAGE_64K)
                | slots
                | if r.flush_queued {
                    pffb::VM_CFG_FLUSH_QUEUED
                } else {
                    0
                }
        }
        Handler::TlbFlushArgs => match off {
            pffb::TLB_FLUSH_PAGE => r.tlb_flush_page,
            _ => r.tlb_flush_vspace,
        },
        Handler::Time => phys.read_reg(off),
        Handler::TimerMisc => match off {
            ptimer::INTR => 0,
            ptimer::INTR_EN => r.timer_intr_en,
            ptimer::CLOCK_DIV => r.clock_div,
            ptimer::CLOCK_MUL => r.clock_mul,
            _ => r.alarm,
        },
        Handler::FifoIntr => match off {
            pfifo::INTR => r.pfifo_intr(),
            _ => r.fifo_en,
        },
        Handler::FifoConfig => match off {
            pfifo::CTRL => r.ctrl,
            pfifo::SUBFIFO_ENABLE => r.subfifo_enable,
            pfifo::ENGINE_INTR_ENABLE => r.engine_intr_enable,
            o => r.eng_subfifo_mask[index(o, pfifo::ENG_SUBFIFO_MASK)],
        },
        Handler::UserdPollBase => r.poll_base,
        Handler::RunlistBase => r.runlist_base,
        Handler::RunlistSubmit => r.runlist_len,
        Handler::RunlistStatus => match off {
            pfifo::RUNLIST_RD_BASE => r.runlist_rd_base,
            _ => r.runlist_len & !pfifo::RUNLIST_PENDING,
        },
        Handler::FifoErrorCodes => match off {
            pfifo::CHAN_TABLE_ERROR => r.chan_table_error,
            _ => r.sched_error,
        },
        Handler::FaultReports => match off {
            pfifo::VM_FAULT_SOURCE => r.vm_fault_source,
            o => {
                let rel = o - pfifo::VM_FAULT;
                r.vm_fault[(rel / pfifo::VM_FAULT_STRIDE) as usize]
                    [(rel % pfifo::VM_FAULT_STRIDE / 4) as usize]
            }
        },
        Handler::FifoIntrSources => match off {
            pfifo::SUBFIFO_INTR_SOURCE => r.subfifo_source(),
            pfifo::ENGINE_INTR_SOURCE => r.engine_source(),
            o => r.engine_intr[index(o, pfifo::ENGINE_INTR)],
        },
        Handler::Kick => r.kick,
        Handler::RunlistIntr => r.runlist_intr,
        Handler::Pbdma => {
            let i = ((off - pfifo::PBDMA_BASE) / pfifo::PBDMA_STRIDE) as usize;
            let p = r.pbdma[i];
            match (off - pfifo::PBDMA_BASE) % pfifo::PBDMA_STRIDE {
                pfifo::PBDMA_METHOD0 => p.method,
                pfifo::PBDMA_DATA0 => p.data,
                pfifo::PBDMA_INTR => p.intr,
                pfifo::PBDMA_INTR_EN => p.intr_en,
                pfifo::PBDMA_CHID => p.chid,
                pfifo::PBDMA_INTR_HALT_MASK => p.halt_mask,
                _ => return Local::Value(None),
            }
        }
        Handler::Prom => r.board.prom(off - gf100::vbios::PROM_BASE),
        Handler::Board | Handler::VgaPorts | Handler::Pmu | Handler::Pgraph => {
            return Local::Value(r.board.read(off))
        }
    }))
}

/// The register writes that only store a value in the VM's registers, or nothing, with nothing
/// for the host to do (the fast path, `write_fast`): the ignored registers, PFLUSH and the TLB
/// flush arguments a driver writes before each flush. True if `h` is one of them (done).
fn write_local(vm: &mut VmState, h: Handler, off: u32, v: u32) -> bool {
    let r = &mut vm.regs;
    match h {
        Handler::Boot0
        | Handler::Endian
        | Handler::MsiRearm
        | Handler::PciMirror
        | Handler::Pflush
        | Handler::FbSize
        | Handler::Time
        | Handler::RunlistStatus
        | Handler::FifoErrorCodes => {}
        Handler::TlbFlushArgs => {
            if off == pffb::TLB_FLUSH_PAGE {
                r.tlb_flush_page = v;
            } else {
                r.tlb_flush_vspace = v;
            }
        }
        _ => return false,
    }
    true
}

/// Applies a register write; false if the register is not implemented (unknown).
fn write_handler(cx: &mut VmCx, h: Handler, off: u32, v: u32) -> bool {
    let r = &mut cx.vm.regs;
    match h {
        Handler::PmcIntr => {
            if off == pmc::INTR_HOST {
                r.pmc_software = v & pmc::INTR_SOFTWARE != 0;
            }
        }
        Handler::PmcIntrEn => {
            let en = v & (pmc::INTR_EN_HARDWARE | pmc::INTR_EN_SOFTWARE);
            if off == pmc::INTR_EN_HOST {
                r.pmc_intr_en_host = en;
            } else {
                r.pmc_intr_en_nrhost = en;
            }
        }
        Handler::PmcEnable => {
            if off == pmc::ENABLE {
                // Clearing PMC ENABLE bit 13 resets the PMU (nouveau's gf100_pmu_reset).
                if r.pmc_enable & (1 << 13) != 0 && v & (1 << 13) == 0 {
                    r.board.pmu.reset();
                }
                let ce0 = gf100::board::pcopy::PMC_ENABLE_CE0;
                if r.pmc_enable & ce0 != 0 && v & ce0 == 0 {
                    r.board.ce0.reset();
                }
                r.pmc_enable = v;
            } else {
                r.spoon_enable = v & ((1 << pfifo::PBDMAS) - 1);
            }
        }
        Handler::PmcIntrMask => r.pmc_mask = v,
        Handler::PraminBase => r.pmem = v,
        Handler::BarInst => {
            if off == pbus::BAR1_INST {
                r.bar1_inst = v;
            } else {
                r.bar3_inst = v;
            }
            aperture::reload(cx, aperture::Reload::Binding);
        }
        Handler::Pramin => {
            aperture::pramin_write(cx, u64::from(off - pbus::PRAMIN_BASE), &v.to_le_bytes())
        }
        Handler::SysmemFlushPage => r.sysmem_flush_page = v,
        Handler::VmCfg => r.vm_cfg = v & pffb::VM_CFG_LARGE_PAGE_64K,
        Handler::TlbFlushTrigger => {
            if v & pffb::FLUSH_TRIGGER != 0 {
                r.flush_queued = true;
                guest_tlb_flush(cx, v);
            }
        }
        Handler::TimerMisc => match off {
            ptimer::INTR => {}
            ptimer::INTR_EN => r.timer_intr_en = v & 1,
            ptimer::CLOCK_DIV => r.clock_div = v & 0xffff,
            ptimer::CLOCK_MUL => r.clock_mul = v & 0xffff,
            _ => r.alarm = v,
        },
        Handler::FifoIntr => {
            if off == pfifo::INTR {
                r.fifo_latched &= !v;
            } else {
                r.fifo_en = v;
            }
        }
        Handler::FifoConfig => match off {
            pfifo::CTRL => r.ctrl = v & pfifo::CTRL_ENABLE,
            pfifo::SUBFIFO_ENABLE => r.subfifo_enable = v & ((1 << pfifo::PBDMAS) - 1),
            pfifo::ENGINE_INTR_ENABLE => r.engine_intr_enable = v,
            o => r.eng_subfifo_mask[index(o, pfifo::ENG_SUBFIFO_MASK)] = v,
        },
        Handler::UserdPollBase => {
            r.poll_base = v;
            cx.vm.map_gen += 1;
        }
        Handler::RunlistBase => r.runlist_base = v,
        Handler::RunlistSubmit => crate::channels::runlist::guest_submit(&mut cx.chan(), v),
        Handler::FaultReports => {
            if off == pfifo::VM_FAULT_SOURCE {
                r.vm_fault_source &= !v;
            }
        }
        Handler::FifoIntrSources => match off {
            pfifo::SUBFIFO_INTR_SOURCE | pfifo::ENGINE_INTR_SOURCE => {}
            o => r.engine_intr[index(o, pfifo::ENGINE_INTR)] &= !v,
        },
        Handler::Kick => crate::channels::kick(&mut cx.chan(), v),
        Handler::RunlistIntr => r.runlist_intr &= !v,
        Handler::ChannelTable => match crate::channels::table_index(off) {
            Some((g, state)) => crate::channels::table_write(&mut cx.chan(), g, state, v),
            None => return false,
        },
        Handler::Pbdma => {
            let i = ((off - pfifo::PBDMA_BASE) / pfifo::PBDMA_STRIDE) as usize;
            let p = &mut r.pbdma[i];
            match (off - pfifo::PBDMA_BASE) % pfifo::PBDMA_STRIDE {
                pfifo::PBDMA_METHOD0 => p.method = v,
                pfifo::PBDMA_DATA0 => p.data = v,
                pfifo::PBDMA_INTR => p.intr &= !v,
                pfifo::PBDMA_INTR_EN => p.intr_en = v,
                pfifo::PBDMA_CHID => {}
                pfifo::PBDMA_INTR_HALT_MASK => p.halt_mask = v,
                _ => return false,
            }
        }
        Handler::Paravirt => return pv::write(cx, off, v),
        // Read-only ROM: writes are ignored, as by the hardware.
        Handler::Prom => {}
        Handler::Pmu => {
            r.board.pmu.write(off, v);
        }
        Handler::Board | Handler::VgaPorts | Handler::Pgraph => return r.board.write(off, v),
        // The registers that only store their value.
        _ => return write_local(cx.vm, h, off, v),
    }
    true
}

/// [`guest_tlb_flush`] with only the VM's state (the fast path): in incremental and PV modes,
/// whose shadows are already current, the BAR bindings are reloaded and the shadow page
/// directories flushed physically (under the GPU-wide `HostLayout::tlb_flush` lock, not the
/// host lock). False, nothing done, in eager and lazy modes (their shadows are rebuilt in the
/// host's VRAM), for a page directory of the invalid target or a BAR instance block that cannot
/// be read (the usual path counts those).
fn tlb_flush_local(
    phys: &dyn PhysicalGpu,
    layout: &HostLayout,
    vm: &mut VmState,
    trigger: u32,
) -> bool {
    let Some(pdb) = flush_target(trigger, vm.regs.tlb_flush_vspace) else {
        return false;
    };
    let Some(pds) = vm.shadow.tlb_flush_in_place(pdb) else {
        return false;
    };
    let flushed = pdb.map(|p| (p.addr, p.target));
    if !aperture::reload_local(phys, vm, aperture::Reload::Flush(flushed)) {
        return false;
    }
    vm.regs.flush_queued = true;
    vm.stats.guest_tlb_flushes += 1;
    if aperture::flushes_bar_tables(&vm.bars, pdb.map(|p| (p.addr, p.target))) {
        vm.map_gen += 1;
    }
    for pd in pds {
        crate::phys_driver::phys_tlb_flush(phys, &layout.tlb_flush, pd, false);
        vm.stats.phys_tlb_flushes += 1;
    }
    true
}

/// The address space a guest TLB flush names: `Some(None)` for all of the VM's (ALL_PDB),
/// `Some(Some(pdb))` for the page directory in `vspace`, `None` if that has the invalid target.
fn flush_target(trigger: u32, vspace: u32) -> Option<Option<GuestPdb>> {
    if trigger & pffb::FLUSH_ALL_PDB != 0 {
        return Some(None);
    }
    pffb::vspace_decode(vspace).map(|(addr, target)| Some(GuestPdb { addr, target }))
}

/// A guest TLB flush (0x100cbc with the trigger bit): the guest's BAR VMs are reloaded, the
/// shadow page tables are told (one address space, or all with ALL_PDB), and the physical TLB is
/// flushed for every shadow page directory they changed.
pub(crate) fn guest_tlb_flush(cx: &mut VmCx, trigger: u32) {
    cx.vm.stats.guest_tlb_flushes += 1;
    let vspace = cx.vm.regs.tlb_flush_vspace;
    let target = flush_target(trigger, vspace);
    // A page directory of the invalid target flushes nothing the BARs could name: reloaded as
    // for ALL_PDB, the conservative choice.
    let flushed = target.flatten().map(|p| (p.addr, p.target));
    aperture::reload(cx, aperture::Reload::Flush(flushed));
    let Some(pdb) = target else {
        cx.vm.map_gen += 1;
        cx.violation(ViolationKind::InvalidTarget, || {
            format!("TLB flush of a page directory with the invalid target ({vspace:#010x})")
        });
        return;
    };
    if aperture::flushes_bar_tables(&cx.vm.bars, pdb.map(|p| (p.addr, p.target))) {
        cx.vm.map_gen += 1;
    }
    let pds = {
        let (sh, mut scx) = cx.shadow();
        sh.tlb_flush(&mut scx, pdb)
    };
    cx.phys_tlb_flush(&pds);
}
