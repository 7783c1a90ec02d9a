//! Runlists (GPUvm "playlists", GXEN `playlist.cc`): a guest's runlist is read from its memory,
//! validated and translated, and the lists of all VMs are merged into the one physical runlist
//! the GPU schedules from.
//!
//! A guest submission (RUNLIST_SUBMIT) reads `count` entries (at most 4095, the field's width)
//! from RUNLIST_BASE through the VM's memory check. An entry naming a channel outside the VM's
//! partition is dropped and counted as a violation; one naming an unbound channel is dropped as
//! the hardware does (SCHED_ERROR INACTIVE_CHANNEL on the guest's virtual PFIFO); duplicates are
//! dropped. The guest sees its update complete at once (RUNLIST_RD_LEN pending clear) and its
//! own runlist-done interrupt. The merged runlist — every VM's accepted channels, in VM order,
//! as physical ids — is written into the other of two hypervisor buffers and submitted.

use gf100::pfifo;

use super::view::{ChanCx, Effect};
use crate::stats::ViolationKind;

/// A guest write of RUNLIST_SUBMIT.
pub(crate) fn guest_submit(cx: &mut ChanCx, value: u32) {
    let regs = &mut cx.vm.regs;
    regs.runlist_len = value;
    regs.runlist_rd_base = regs.runlist_base;
    let base = regs.runlist_base;
    cx.vm.stats.runlist_submits += 1;
    let count = (value & pfifo::RUNLIST_LEN_MASK) as usize;
    let mut list = Vec::new();
    let mut seen = [false; pfifo::CHANNELS as usize];
    let (mut foreign, mut inactive) = (0u64, 0u64);
    match pfifo::runlist_base_decode(base) {
        None => {
            cx.violation(ViolationKind::InvalidTarget, || {
                format!("runlist base {base:#010x} has the invalid target")
            });
            inactive = count as u64;
        }
        Some((addr, target)) => {
            let mut buf = vec![0u8; count * pfifo::RUNLIST_ENTRY_SIZE as usize];
            match cx.gmem().read(target, addr, &mut buf) {
                Err(v) => {
                    cx.violation(v.into(), || format!("runlist at {addr:#x}: {v}"));
                    inactive = count as u64;
                }
                Ok(()) => {
                    for e in buf.chunks_exact(pfifo::RUNLIST_ENTRY_SIZE as usize) {
                        let g = u32::from_le_bytes([e[0], e[1], e[2], e[3]]);
                        if g >= cx.vm.nchan() {
                            foreign += 1;
                        } else if cx.vm.chans[g as usize].bound.is_none() {
                            inactive += 1;
                        } else if !seen[g as usize] {
                            seen[g as usize] = true;
                            list.push(g);
                        }
                    }
                }
            }
        }
    }
    if foreign > 0 {
        // One log line per submission, however many entries were bad.
        let n = cx.vm.nchan();
        cx.violation(ViolationKind::RunlistEntry, || {
            format!("runlist names {foreign} channel(s) outside the VM's {n}")
        });
        cx.vm
            .stats
            .violations
            .add(ViolationKind::RunlistEntry, foreign - 1);
    }
    if foreign + inactive > 0 {
        cx.vm.regs.sched_error(pfifo::SCHED_ERR_INACTIVE_CHANNEL);
    }
    // Submissions held because the channel was not listed go to the scheduler now.
    for &g in &list {
        if let Some(c) = cx.vm.chans.get_mut(g as usize) {
            if std::mem::take(&mut c.held) {
                cx.vm.effects.push(Effect::Doorbell(g));
            }
        }
    }
    *cx.vm.runlist = list;
    cx.vm.effects.push(Effect::RunlistChanged);
    cx.vm.regs.runlist_intr |= pfifo::INTR_RUNLIST_EVENT;
}
