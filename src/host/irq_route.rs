//! Physical interrupts, routed to the VM they belong to (GPUvm routes completions to the VM that
//! owns the channel; fault routing by instance block is this model's addition).
//!
//! The host owns the physical interrupt line (an atomic flag, see [`crate::host`]); when it is
//! asserted, [`service`] reads PFIFO INTR and handles each source, acknowledging it physically:
//!
//! - **MMU fault** (bit 28): the faulting instance is a shadow instance block, which names the VM
//!   and guest channel. The VM's virtual VM_FAULT\[unit\] shows the *guest's* instance address
//!   (its channel-table word) and the VA; its virtual PFIFO bit 28 rises. Faults of an instance
//!   no VM owns (the host's BAR1) are counted and logged.
//! - **PBDMA error** (bit 29): the PBDMA's CHID names the physical channel and so the VM; the VM's
//!   virtual PBDMA registers show the error bits, the *guest* channel id, METHOD0 and DATA0.
//! - **Non-stall** (bit 31): the hardware does not say which channel raised it, so it is delivered
//!   to every VM whose work was on the GPU since the last service. A VM may thus see a spurious
//!   non-stall interrupt; that is harmless, because a non-stall interrupt only tells a driver to
//!   look at its fences (nouveau re-reads the sequence and goes back to sleep if nothing moved).
//! - **Runlist done** (bit 30): the host's own runlist updates; acknowledged.
//! - **Channel-table / scheduling errors** (bits 0, 8): only the host programs the physical channel
//!   table and runlist, with validated values, so these are host bugs: acknowledged, counted and
//!   logged.
//!
//! Each VM's interrupt line then follows its virtual PMC state (recomputed by the host after
//! every access).

use gf100::fault::FaultFlags;
use gf100::{pfifo, Target};

use crate::host::HostState;
use crate::mmio::vregs::VFault;
use crate::phys::PhysicalGpu;
use crate::sched::VmId;

/// Services every pending physical PFIFO interrupt.
pub(crate) fn service(st: &mut HostState, phys: &dyn PhysicalGpu) {
    st.counters.irq_services += 1;
    let intr = phys.read_reg(pfifo::INTR);
    if intr & pfifo::INTR_VM_FAULT != 0 {
        faults(st, phys);
    }
    if intr & pfifo::INTR_PBDMA != 0 {
        pbdma(st, phys);
    }
    if intr & pfifo::INTR_RUNLIST_DONE != 0 {
        let v = phys.read_reg(pfifo::INTR_RUNLIST);
        phys.write_reg(pfifo::INTR_RUNLIST, v);
    }
    if intr & pfifo::INTR_NON_STALL != 0 {
        nonstall(st, phys);
    }
    for (bit, reg, what) in [
        (
            pfifo::INTR_CHAN_TABLE_ERROR,
            pfifo::CHAN_TABLE_ERROR,
            "channel-table",
        ),
        (pfifo::INTR_SCHED_ERROR, pfifo::SCHED_ERROR, "scheduling"),
    ] {
        if intr & bit != 0 {
            let code = phys.read_reg(reg) & pfifo::ERROR_CODE_MASK;
            phys.write_reg(pfifo::INTR, bit);
            st.counters.phys_fifo_errors += 1;
            log::error!("physical PFIFO {what} error {code:#x} (a host bug)");
        }
    }
    // Anything else pending that the host does not handle is cleared so the line can drop.
    let known = pfifo::INTR_VM_FAULT
        | pfifo::INTR_PBDMA
        | pfifo::INTR_RUNLIST_DONE
        | pfifo::INTR_NON_STALL
        | pfifo::INTR_CHAN_TABLE_ERROR
        | pfifo::INTR_SCHED_ERROR;
    if intr & !known != 0 {
        phys.write_reg(pfifo::INTR, intr & !known);
    }
    // Non-stall candidates from now on: the VMs whose work is still on the GPU.
    st.nonstall = st.inflight.iter().map(|f| f.sub.vm).collect();
}

/// The VM, guest channel and guest CHAN word of the context whose shadow instance block is
/// `inst_word` (addr >> 12 | target): a bound channel, or one unbound while the GPU could still
/// report faults for it (its block is retired, and not reused until released: `channels`).
fn owner_of_instance(st: &HostState, inst_word: u32) -> Option<(VmId, u32, u32)> {
    let (addr, target) = pfifo::chan_decode(inst_word | pfifo::CHAN_VALID)?;
    if target != Target::Vram {
        return None;
    }
    st.vms.values().find_map(|vm| {
        let bound = vm.chans.iter().enumerate().find_map(|(g, c)| {
            c.bound
                .as_ref()
                .filter(|b| b.shadow_inst.raw() == addr)
                .map(|_| (vm.id, g as u32, c.chan_word))
        });
        bound.or_else(|| {
            vm.retired_insts
                .iter()
                .find(|r| r.shadow.raw() == addr)
                .map(|r| (vm.id, r.guest_chid, r.guest_word))
        })
    })
}

fn faults(st: &mut HostState, phys: &dyn PhysicalGpu) {
    let src = phys.read_reg(pfifo::VM_FAULT_SOURCE);
    for unit in 0..pfifo::VM_FAULT_UNITS {
        if src & (1 << unit) == 0 {
            continue;
        }
        let inst = phys.read_reg(pfifo::vm_fault(unit, pfifo::VM_FAULT_INST));
        let lo = phys.read_reg(pfifo::vm_fault(unit, pfifo::VM_FAULT_ADDR_LO));
        let hi = phys.read_reg(pfifo::vm_fault(unit, pfifo::VM_FAULT_ADDR_HI));
        let flags = phys.read_reg(pfifo::vm_fault(unit, pfifo::VM_FAULT_FLAGS));
        phys.write_reg(pfifo::VM_FAULT_SOURCE, 1 << unit);
        st.counters.phys_faults += 1;
        let va = u64::from(hi) << 32 | u64::from(lo);
        match owner_of_instance(st, inst) {
            Some((id, g, word)) => {
                let Some(mut vm) = st.vms.get_mut(&id) else {
                    continue;
                };
                let guest_inst = word & !(pfifo::CHAN_VALID | pfifo::CHAN_POLL_ENABLE);
                let f = VFault {
                    unit,
                    inst: guest_inst,
                    va,
                    flags: FaultFlags::decode(flags),
                };
                if vm.regs.report_fault(f) {
                    vm.stats.faults_delivered += 1;
                }
                // The GPU stopped the channel (RUNNABLE cleared); the guest's view follows, even
                // when the fault came after the host had switched the channel out. The physical
                // RUNNABLE goes off too: a submission dispatched between the fault and now set
                // it again, and the work after the fault must not run before the guest saw it.
                if let Some(ch) = vm.chans.get_mut(g as usize).filter(|c| c.chan_word == word) {
                    ch.enabled = false;
                    crate::host::dispatch::runnable_off(phys, vm.phys_chid(g));
                }
                if vm.log.hit() {
                    log::info!(
                        "{id}: MMU fault of channel {g}: unit {unit:#x} VA {va:#x} reason {:#x}",
                        f.flags.reason
                    );
                }
            }
            None => {
                st.counters.unrouted += 1;
                log::warn!(
                    "physical MMU fault of no VM's channel: unit {unit:#x} instance {inst:#x} VA {va:#x} flags {flags:#x}"
                );
            }
        }
    }
}

fn pbdma(st: &mut HostState, phys: &dyn PhysicalGpu) {
    let src = phys.read_reg(pfifo::SUBFIFO_INTR_SOURCE);
    for i in 0..pfifo::PBDMAS {
        if src & (1 << i) == 0 {
            continue;
        }
        let intr = phys.read_reg(pfifo::pbdma(i, pfifo::PBDMA_INTR));
        let chid = phys.read_reg(pfifo::pbdma(i, pfifo::PBDMA_CHID)) & pfifo::PBDMA_CHID_MASK;
        let method = phys.read_reg(pfifo::pbdma(i, pfifo::PBDMA_METHOD0));
        let data = phys.read_reg(pfifo::pbdma(i, pfifo::PBDMA_DATA0));
        if intr != 0 {
            // Before the acknowledgement lets the PBDMA go on: the channel may not run again
            // until the host dispatches to it, which it does once the guest, having seen the
            // error, enables the channel (a submission dispatched between the error and now
            // set RUNNABLE again).
            crate::host::dispatch::runnable_off(phys, chid);
        }
        phys.write_reg(pfifo::pbdma(i, pfifo::PBDMA_INTR), intr);
        if intr == 0 {
            continue;
        }
        st.counters.phys_pbdma_errors += 1;
        let owner = st.part.owner.get(chid as usize).copied().flatten();
        match owner.and_then(|id| st.vms.get_mut(&id)) {
            Some(mut vm) => {
                let g = chid - vm.chan_base;
                let p = &mut vm.regs.pbdma[i as usize];
                p.intr |= intr;
                p.chid = g | pfifo::PBDMA_CHID_ACTIVE;
                p.method = method;
                p.data = data;
                vm.stats.pbdma_errors_delivered += 1;
                if let Some(ch) = vm.chans.get_mut(g as usize) {
                    ch.enabled = false;
                }
                if vm.log.hit() {
                    log::info!(
                        "{}: PBDMA {i} error {intr:#x} on channel {g} (method {method:#x} data {data:#x})",
                        vm.id
                    );
                }
            }
            None => {
                st.counters.unrouted += 1;
                log::warn!("physical PBDMA {i} error {intr:#x} on unowned channel {chid}");
            }
        }
    }
}

fn nonstall(st: &mut HostState, phys: &dyn PhysicalGpu) {
    let src = phys.read_reg(pfifo::ENGINE_INTR_SOURCE);
    let mut notify = [0u32; pfifo::ENGINES as usize];
    for e in 0..pfifo::ENGINES {
        if src & (1 << e) != 0 {
            let reg = pfifo::ENGINE_INTR + e * 4;
            let v = phys.read_reg(reg);
            phys.write_reg(reg, v);
            notify[e as usize] = v;
        }
    }
    st.counters.phys_nonstall += 1;
    let targets: Vec<VmId> = st.nonstall.iter().copied().collect();
    for id in targets {
        if let Some(mut vm) = st.vms.get_mut(&id) {
            for (e, v) in notify.iter().enumerate() {
                vm.regs.engine_intr[e] |= v;
            }
            vm.stats.nonstall_delivered += 1;
        }
    }
}
