//! Shadow channels (GPUvm §"Virtualizing GPU channels"; GXEN `channel.cc`, `pfifo.cc`): each VM
//! owns a contiguous partition of the 128 physical channels; guest channel `g` is physical
//! channel `base + g` and is valid only for `g < profile.channels`.
//!
//! **Binding** (a guest write of CHAN_TABLE\[g\].CHAN with VALID): the guest's 4 KiB instance
//! block is copied into a hypervisor-owned page and patched — RAMFC USERD points at the
//! hypervisor's USERD page of the physical channel, the page-directory base at the shadow page
//! directory ([`crate::shadow_pt::ShadowPt::attach`]; an invalid guest PDB gets the host's
//! empty page directory, so the channel only faults), the VM limit is clamped to 2^40 - 1, the
//! GR context pointer names a context the host owns ([`grctx`]), never the guest's, and every
//! other engine context pointer is zeroed. The physical channel is bound to the copy. The guest page is write-tracked: any later guest write to it (PRAMIN, BAR1,
//! BAR3) refreshes the copy, as GPUvm's "barrier" table does. Unbinding first gets the channel
//! off the GPU ([`preempt::stop`]: disable, preempt, reset the engine if it still runs the
//! channel's operation), then detaches the shadow page directory and frees the copy.
//!
//! **Work in flight.** Everything freed here (shadow instance blocks, shadow page directories
//! and tables) goes through the hypervisor VRAM quarantine (`crate::vram_alloc::HypVram`): it is
//! handed out again only once the VM's channels have been seen off the GPU. A re-pointed page
//! directory (the guest writes a new PDB into a bound channel's instance block) is rewritten
//! into the shadow instance block *before* the old shadow is let go, so a channel that loads
//! its context after that sees the new one, and one still running on the old shadow keeps a
//! live (quarantined, never reused) copy of it until it leaves the GPU. The addresses of retired
//! shadow instance blocks are remembered until released, so a fault the GPU reports for the old
//! context is delivered to the VM that ran it (`crate::host::irq_route`).
//!
//! **STATE RUNNABLE is the host's** (the class of attacks in which work reaches an
//! engine without a scheduling decision). The guest's RUNNABLE is kept virtually ([`VChan::enabled`]:
//! what it wrote, cleared when the GPU stopped the channel or the watchdog killed it) and shown in
//! its STATE reads; the physical RUNNABLE is set only while a submission of the channel is in
//! flight, by the host's dispatch, and cleared when it leaves the GPU (`crate::host::dispatch`).
//! So a channel the guest enables again, one resuming from a semaphore acquire, one restored
//! from a snapshot or put back on the runlist runs only when the scheduler dispatches it. The
//! engine field of STATE is forwarded; a guest disable reaches the GPU at once. KICK is
//! translated. Runlists are in `runlist`, USERD emulation in `userd`, the pushbuffer scan of
//! the submission path in [`cmdscan`].

pub mod cmdscan;
pub(crate) mod grctx;
pub(crate) mod preempt;
pub(crate) mod runlist;
pub(crate) mod userd;
mod view;

use gf100::{inst, mmu, pfifo, userd as ud, Target};

use crate::addr::HostVram;
use crate::shadow_pt::GuestPdb;
use crate::stats::ViolationKind;

use cmdscan::ScanState;

pub(crate) use view::{ChanCx, ChanVm, Effect};

/// A guest channel bound to its physical channel.
#[derive(Debug, Clone)]
pub(crate) struct BoundChan {
    /// The guest's instance block.
    pub inst: (u64, Target),
    /// The shadow instance block in hypervisor VRAM.
    pub shadow_inst: HostVram,
    /// The guest page directory the shadow is attached to (`None`: the empty PD).
    pub pdb: Option<GuestPdb>,
    /// GPFIFO ring base VA and log2 of its entries, from the guest's RAMFC.
    pub ib_base: u64,
    pub ib_order: u32,
    /// Pushbuffer scan state carried between submissions.
    pub scan: ScanState,
    /// The part of the guest's block the shadow was built from (RAMFC, PDB, limit, the GR
    /// context pointer).
    pub guest: Vec<u8>,
    /// The host-owned GR context of the channel ([`grctx`]), once the guest named one.
    pub grctx: Option<HostVram>,
}

/// A shadow instance block that was freed while the GPU may still report faults for it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetiredInst {
    /// Its address in hypervisor VRAM.
    pub shadow: HostVram,
    /// The guest channel it served.
    pub guest_chid: u32,
    /// The guest's CHAN word at the time.
    pub guest_word: u32,
}

/// Bytes of a guest instance block the shadow depends on: RAMFC, the PDB, the limit and the GR
/// context pointer (only whether it is valid matters).
const INST_USED: usize = (inst::GR_CTX + 8) as usize;

/// One guest channel.
#[derive(Debug, Clone, Default)]
pub(crate) struct VChan {
    /// CHAN word as the guest wrote it.
    pub chan_word: u32,
    pub bound: Option<BoundChan>,
    /// Bound at least once since the VM was created: only such a physical channel can have run
    /// for this VM, so measured charges read no channel above the last of them
    /// (`VmState::ran_chans`).
    pub ever_bound: bool,
    /// GP_PUT as the guest last wrote it (what its USERD reads show).
    pub gp_put: u32,
    /// GP_PUT last written to the physical channel.
    pub phys_put: u32,
    /// Killed by the host's watchdog: STATE RUNNABLE can no longer be set and doorbells are
    /// ignored until the guest unbinds the channel (and binds it again), as after nouveau's
    /// recovery of a hung channel.
    pub killed: bool,
    /// A submission was held back because the channel was not runnable or not on the
    /// runlist when the scheduler picked it; it is queued again when that changes.
    pub held: bool,
    /// STATE RUNNABLE as the guest sees it: what it last wrote, cleared when the GPU stopped the
    /// channel (fault, PBDMA error) or the watchdog killed it. The physical RUNNABLE is the
    /// host's (module documentation).
    pub enabled: bool,
    /// The channel's submission left the GPU with work left (parked on a semaphore acquire,
    /// preempted at the end of its VM's time slice or cap, disabled or taken off the runlist
    /// by the guest): the host queues it again when it may run (`crate::host::dispatch`).
    pub parked: bool,
    /// With a backend that cannot tell what a parked channel waits on: the GPU time before
    /// which it is not retried.
    pub retry_at: u64,
    /// The physical GP_PUT of the channel's last submission the host saw complete (every entry
    /// up to it fetched and run); `None` after a bind or a restore. While it equals `phys_put`
    /// and the guest rings GP_PUT with that same value, the doorbell announces nothing (the
    /// fast path's `vgpu::aperture::userd_doorbell_fast`).
    pub done_put: Option<u32>,
}

/// Guest channel id of a CHAN_TABLE / STATE offset.
pub(crate) fn table_index(offset: u32) -> Option<(u32, bool)> {
    pfifo::chan_table_index(offset)
}

/// Checks that `g` is one of the VM's channels; counts a violation otherwise.
fn own(cx: &mut ChanCx, g: u32, what: &str) -> bool {
    if g < cx.vm.nchan() {
        return true;
    }
    let n = cx.vm.nchan();
    cx.violation(ViolationKind::ForeignChannel, || {
        format!("{what} of channel {g}, the VM owns {n}")
    });
    false
}

/// A guest read of CHAN_TABLE\[g\].CHAN or .STATE.
pub(crate) fn table_read(cx: &mut ChanCx, g: u32, state: bool) -> u32 {
    if g >= cx.vm.nchan() {
        return 0;
    }
    if state {
        let phys = cx.phys.read_reg(pfifo::chan_state(cx.vm.phys_chid(g)));
        let c = &cx.vm.chans[g as usize];
        let run = if c.enabled && !c.killed {
            pfifo::STATE_RUNNABLE
        } else {
            0
        };
        (phys & !pfifo::STATE_RUNNABLE) | run
    } else {
        cx.vm.chans[g as usize].chan_word
    }
}

/// A guest write of CHAN_TABLE\[g\].CHAN or .STATE.
pub(crate) fn table_write(cx: &mut ChanCx, g: u32, state: bool, value: u32) {
    if !own(cx, g, if state { "STATE write" } else { "bind" }) {
        return;
    }
    if state {
        let p = cx.vm.phys_chid(g);
        let ch = &mut cx.vm.chans[g as usize];
        let enable = value & pfifo::STATE_RUNNABLE != 0 && !ch.killed;
        ch.enabled = enable;
        // The engine field as written; RUNNABLE stays as the host set it (on only while a
        // submission is in flight), and goes off at once when the guest disables.
        let run = if enable {
            cx.phys.read_reg(pfifo::chan_state(p)) & pfifo::STATE_RUNNABLE
        } else {
            0
        };
        cx.phys.write_reg(
            pfifo::chan_state(p),
            (value & pfifo::STATE_ENGINE_MASK) | run,
        );
        // A submission held because the channel was disabled goes to the scheduler now (a
        // parked one is queued again by the host once it may run).
        let ch = &mut cx.vm.chans[g as usize];
        if enable && std::mem::take(&mut ch.held) {
            cx.vm.effects.push(Effect::Doorbell(g));
        }
    } else {
        chan_write(cx, g, value);
    }
}

/// KICK: the guest's channel id is translated; the register reads back the guest's id with the
/// pending bit clear.
pub(crate) fn kick(cx: &mut ChanCx, value: u32) {
    let g = value & (pfifo::CHANNELS - 1);
    cx.vm.regs.kick = g;
    if !own(cx, g, "kick") {
        return;
    }
    if cx.vm.chans[g as usize].bound.is_some() {
        cx.phys.write_reg(pfifo::KICK, cx.vm.phys_chid(g));
    }
}

/// Binds guest channel `g` with CHAN word `value` as a guest write of it would (a restored
/// snapshot's channels); true if the channel ended up bound. Violations are counted as for the
/// guest's own write.
pub(crate) fn restore_binding(cx: &mut ChanCx, g: u32, value: u32) -> bool {
    if g >= cx.vm.nchan() {
        return false;
    }
    chan_write(cx, g, value);
    cx.vm.chans[g as usize].bound.is_some()
}

fn chan_write(cx: &mut ChanCx, g: u32, value: u32) {
    let gi = g as usize;
    cx.vm.chans[gi].chan_word = value;
    if value & pfifo::CHAN_VALID == 0 {
        unbind(cx, g);
        return;
    }
    let Some((inst, target)) = pfifo::chan_decode(value) else {
        cx.vm.regs.chan_table_error(pfifo::CHAN_ERR_INVALID_TARGET);
        cx.violation(ViolationKind::InvalidTarget, || {
            format!("channel {g} bound with the invalid target ({value:#010x})")
        });
        unbind(cx, g);
        return;
    };
    if value & pfifo::CHAN_POLL_ENABLE != 0 && cx.vm.regs.poll_area().is_none() {
        cx.vm.regs.chan_table_error(pfifo::CHAN_ERR_NO_POLL);
        cx.violation(ViolationKind::RefusedBind, || {
            format!("channel {g} bound with POLL_ENABLE before the poll area was set")
        });
        unbind(cx, g);
        return;
    }
    // A rebind keeps the channel's enable (the hardware's STATE word is not part of the CHAN
    // word); unbinding on the way stops it, so it is restored after the new bind.
    let mut keep_state = 0;
    let mut keep_enabled = false;
    if let Some(b) = &cx.vm.chans[gi].bound {
        if b.inst == (inst, target) {
            refresh(cx, g);
            return;
        }
        keep_state =
            cx.phys.read_reg(pfifo::chan_state(cx.vm.phys_chid(g))) & pfifo::STATE_ENGINE_MASK;
        keep_enabled = cx.vm.chans[gi].enabled;
        unbind(cx, g);
    }
    let mut block = vec![0u8; inst::SIZE as usize];
    if let Err(v) = cx.gmem().read(target, inst, &mut block) {
        cx.vm.regs.chan_table_error(pfifo::CHAN_ERR_INVALID_TARGET);
        cx.violation(v.into(), || {
            format!("channel {g}: instance block {inst:#x} ({target:?}): {v}")
        });
        return;
    }
    if let Err(what) = check_userd(cx, &block) {
        cx.vm.regs.chan_table_error(pfifo::CHAN_ERR_INVALID_TARGET);
        cx.violation(ViolationKind::InstanceBlock, || {
            format!("channel {g}: USERD {what}")
        });
        return;
    }
    let Some(shadow_inst) = cx.hyp.alloc(inst::SIZE, inst::SIZE).map(HostVram) else {
        log::error!(
            "{}: out of hypervisor VRAM for a shadow instance block",
            cx.vm.id
        );
        cx.vm.regs.chan_table_error(pfifo::CHAN_ERR_INVALID_TARGET);
        return;
    };
    let p = cx.vm.phys_chid(g);
    // A fresh channel: GP_GET and GP_PUT start at 0, as on a newly bound channel.
    cx.phys.fill_vram(cx.layout.userd_page(p), ud::SIZE, 0);
    cx.vm.chans[gi].bound = Some(BoundChan {
        inst: (inst, target),
        shadow_inst,
        pdb: None,
        ib_base: 0,
        ib_order: 0,
        scan: ScanState::default(),
        guest: Vec::new(),
        grctx: None,
    });
    cx.vm.chans[gi].ever_bound = true;
    cx.vm.chans[gi].gp_put = 0;
    cx.vm.chans[gi].phys_put = 0;
    cx.vm.chans[gi].done_put = None;
    write_shadow(cx, g, &block);
    cx.phys.write_reg(
        pfifo::chan_table(p),
        pfifo::chan_encode(shadow_inst.raw(), Target::Vram),
    );
    if keep_state != 0 {
        cx.phys.write_reg(pfifo::chan_state(p), keep_state);
    }
    // Nothing given to the GPU yet: if its GP_GET is where GP_PUT starts, nothing is left
    // either (what the host's doorbell handler checks), so a doorbell of 0 announces nothing.
    let mut get = [0u8; 4];
    cx.phys.read_vram(
        cx.layout.userd_page(p).offset(gf100::userd::GP_GET),
        &mut get,
    );
    if u32::from_le_bytes(get) == 0 {
        cx.vm.chans[gi].done_put = Some(0);
    }
    cx.vm.chans[gi].enabled = keep_enabled;
    cx.vm
        .inst_pages
        .entry(page_key(target, inst))
        .or_default()
        .push(g);
    *cx.vm.map_gen += 1;
    cx.vm.stats.channel_binds += 1;
}

/// Guest instance-block pages of bound channels: (sysram?, page address) -> guest chids. Looked
/// up at every guest memory write ([`write_reaches_instance`]), so hashed with aHash, not
/// SipHash. With aHash's keys fixed per process (`AHasher::default`): the map is the VM's own and
/// holds at most one entry per channel bound now (a rebind or unbind removes the old one), too
/// few for colliding keys to cost anything.
pub type InstPages =
    std::collections::HashMap<(bool, u64), Vec<u32>, std::hash::BuildHasherDefault<ahash::AHasher>>;

/// True if a guest write of `len` bytes at `addr` in `target` reaches a page holding one of
/// the VM's bound channels' instance blocks ([`on_guest_write`] refreshes their shadows).
pub(crate) fn write_reaches_instance(
    inst_pages: &InstPages,
    target: Target,
    addr: u64,
    len: u64,
) -> bool {
    if inst_pages.is_empty() || len == 0 {
        return false;
    }
    let last = addr.saturating_add(len - 1) & !(gf100::PAGE_SIZE - 1);
    let mut page = addr & !(gf100::PAGE_SIZE - 1);
    loop {
        if inst_pages.contains_key(&page_key(target, page)) {
            return true;
        }
        if page >= last {
            return false;
        }
        page += gf100::PAGE_SIZE;
    }
}

/// The write-tracking key of a guest page (both system-memory targets name the same memory).
fn page_key(target: Target, addr: u64) -> (bool, u64) {
    (target.is_sysram(), addr & !(gf100::PAGE_SIZE - 1))
}

fn rd_u32(block: &[u8], off: u64) -> u32 {
    let o = off as usize;
    u32::from_le_bytes([block[o], block[o + 1], block[o + 2], block[o + 3]])
}

fn rd_u64(block: &[u8], off: u64) -> u64 {
    u64::from(rd_u32(block, off)) | u64::from(rd_u32(block, off + 4)) << 32
}

fn wr_u64(block: &mut [u8], off: u64, v: u64) {
    let o = off as usize;
    block[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

/// The guest's RAMFC USERD pointer must name a page of its own memory (it is never used
/// physically: the shadow points at the hypervisor's page).
fn check_userd(cx: &ChanCx, block: &[u8]) -> Result<(), String> {
    let raw = rd_u64(block, inst::RAMFC_USERD_LO);
    let (addr, t) =
        inst::userd_decode(raw).ok_or_else(|| format!("{raw:#x} has the invalid target"))?;
    cx.gmem()
        .to_phys(t, addr, ud::SIZE)
        .map(|_| ())
        .map_err(|v| format!("{addr:#x}: {v}"))
}

/// Builds and writes the shadow instance block of bound channel `g` from the guest's `block`.
fn write_shadow(cx: &mut ChanCx, g: u32, block: &[u8]) {
    let gi = g as usize;
    let Some(old_pdb) = cx.vm.chans[gi].bound.as_ref().map(|b| b.pdb) else {
        return;
    };
    let guest_pdb = inst::pdb_decode(rd_u64(block, inst::PDB_LO))
        .map(|(addr, target)| GuestPdb { addr, target });
    // Attach the new page directory before detaching the old one, so a shadow used by both
    // is not torn down in between.
    let attached = match guest_pdb {
        Some(pdb) => {
            let r = {
                let (sh, mut scx) = cx.shadow();
                sh.attach(&mut scx, pdb)
            };
            match r {
                Ok(pd) => Some((pdb, pd)),
                Err(e) => {
                    cx.violation(ViolationKind::InstanceBlock, || {
                        format!("channel {g}: page directory: {e}")
                    });
                    None
                }
            }
        }
        None => {
            cx.violation(ViolationKind::InstanceBlock, || {
                format!("channel {g}: page directory base with the invalid target")
            });
            None
        }
    };
    let pd = attached.map_or(cx.layout.null_pd, |(_, pd)| pd);
    if let Some((_, pd)) = attached {
        // The address of a shadow directory may have belonged to a freed shadow (of this or
        // another VM) whose translations the physical TLB still holds: flush it before any
        // channel runs on it.
        cx.phys_tlb_flush(&[pd]);
    }
    let p = cx.vm.phys_chid(g);
    let mut sh = vec![0u8; inst::SIZE as usize];
    let ramfc = inst::RAMFC_SIZE as usize;
    sh[..ramfc].copy_from_slice(&block[..ramfc]);
    wr_u64(
        &mut sh,
        inst::RAMFC_USERD_LO,
        inst::userd_encode(cx.layout.userd_page(p).raw(), Target::Vram),
    );
    wr_u64(
        &mut sh,
        inst::PDB_LO,
        inst::pdb_encode(pd.raw(), Target::Vram),
    );
    // The GR context pointer is the host's (grctx); every other engine pointer stays 0.
    let host_ctx = grctx::shadow_pointer(cx, g, block, &mut sh);
    let limit = if host_ctx {
        mmu::VA_LIMIT - 1
    } else {
        rd_u64(block, inst::LIMIT_LO).min(mmu::VA_LIMIT - 1)
    };
    wr_u64(&mut sh, inst::LIMIT_LO, limit);
    let (ib_base, ib_order) = inst::ib_config_decode(
        rd_u32(block, inst::RAMFC_IB_BASE_LO),
        rd_u32(block, inst::RAMFC_IB_CONFIG),
    );
    if let Some(b) = cx.vm.chans[gi].bound.as_mut() {
        b.guest = block[..INST_USED].to_vec();
        b.pdb = attached.map(|(pdb, _)| pdb);
        b.ib_base = ib_base;
        b.ib_order = ib_order;
        cx.phys.write_vram(b.shadow_inst, &sh);
    }
    // Only now that no context load can find the old page directory is it let go; a channel
    // still running on it keeps it (quarantined) until it is off the GPU.
    if let Some(old) = old_pdb {
        let (sh, mut scx) = cx.shadow();
        sh.detach(&mut scx, old);
    }
}

/// Re-copies the guest instance block of bound channel `g` after the guest wrote to it.
pub(crate) fn refresh(cx: &mut ChanCx, g: u32) {
    let Some((inst, target)) = cx.vm.chans[g as usize].bound.as_ref().map(|b| b.inst) else {
        return;
    };
    let mut block = vec![0u8; inst::SIZE as usize];
    if let Err(v) = cx.gmem().read(target, inst, &mut block) {
        // Cannot happen for a block that was validated at bind (slices do not shrink).
        cx.violation(v.into(), || format!("channel {g}: instance block: {v}"));
        return;
    }
    let same = cx.vm.chans[g as usize]
        .bound
        .as_ref()
        .is_some_and(|b| b.guest[..] == block[..INST_USED]);
    if same {
        return;
    }
    if let Err(what) = check_userd(cx, &block) {
        cx.violation(ViolationKind::InstanceBlock, || {
            format!("channel {g}: USERD {what} (ignored: USERD is emulated)")
        });
    }
    write_shadow(cx, g, &block);
    cx.vm.stats.instance_refreshes += 1;
}

/// Refreshes every bound channel (after a para-virtual batch, which may write anywhere in the
/// guest's tables).
pub(crate) fn refresh_all(cx: &mut ChanCx) {
    for g in 0..cx.vm.nchan() {
        if cx.vm.chans[g as usize].bound.is_some() {
            refresh(cx, g);
        }
    }
}

/// Unbinds guest channel `g` (if bound): the physical channel is stopped and taken off the GPU
/// ([`preempt::stop`]; an operation still running is aborted), unbound, the shadow detached and
/// the shadow instance block scrubbed and retired (quarantined until released).
pub(crate) fn unbind(cx: &mut ChanCx, g: u32) {
    cx.vm.chans[g as usize].killed = false;
    cx.vm.chans[g as usize].held = false;
    cx.vm.chans[g as usize].parked = false;
    cx.vm.chans[g as usize].enabled = false;
    let Some(b) = cx.vm.chans[g as usize].bound.take() else {
        return;
    };
    let p = cx.vm.phys_chid(g);
    let stopped = preempt::stop(cx.phys, p);
    if !stopped.reset.is_empty() {
        cx.vm.stats.inflight_aborts += 1;
        log::info!(
            "{}: channel {g} unbound with an operation in flight; engines {:?} reset",
            cx.vm.id,
            stopped.reset
        );
    }
    cx.phys.write_reg(pfifo::chan_table(p), 0);
    grctx::release(cx, g, b.grctx);
    if let Some(pdb) = b.pdb {
        let (sh, mut scx) = cx.shadow();
        sh.detach(&mut scx, pdb);
    }
    cx.phys.fill_vram(b.shadow_inst, inst::SIZE, 0);
    if cx.hyp.free(b.shadow_inst.raw(), inst::SIZE) {
        let guest_word = cx.vm.chans[g as usize].chan_word;
        cx.vm.retired_insts.push(RetiredInst {
            shadow: b.shadow_inst,
            guest_chid: g,
            guest_word,
        });
    }
    let key = page_key(b.inst.1, b.inst.0);
    if let Some(list) = cx.vm.inst_pages.get_mut(&key) {
        list.retain(|&c| c != g);
        if list.is_empty() {
            cx.vm.inst_pages.remove(&key);
        }
        *cx.vm.map_gen += 1;
    }
    if cx.vm.runlist.contains(&g) {
        cx.vm.runlist.retain(|&c| c != g);
        cx.vm.effects.push(Effect::RunlistChanged);
    }
    cx.vm.effects.push(Effect::ChannelGone(g));
}

/// Stops and unbinds every channel of the VM (teardown). Returns false if a channel could not
/// be taken off the GPU (its partition must then not be reused).
pub(crate) fn unbind_all(cx: &mut ChanCx) -> bool {
    let mut all_off = true;
    for g in 0..cx.vm.nchan() {
        let p = cx.vm.phys_chid(g);
        // Bound or not, nothing of the channel may stay on the GPU.
        all_off &= preempt::stop(cx.phys, p).off;
        unbind(cx, g);
        cx.phys.fill_vram(cx.layout.userd_page(p), ud::SIZE, 0);
    }
    cx.vm.runlist.clear();
    cx.vm.effects.clear();
    all_off
}

/// A guest write of `len` bytes at `addr` in `target` landed: refresh the shadow instance blocks
/// of channels whose guest instance block it touched.
pub(crate) fn on_guest_write(cx: &mut ChanCx, target: Target, addr: u64, len: u64) {
    if cx.vm.inst_pages.is_empty() || len == 0 {
        return;
    }
    let first = addr & !(gf100::PAGE_SIZE - 1);
    let last = addr.saturating_add(len - 1) & !(gf100::PAGE_SIZE - 1);
    let mut page = first;
    loop {
        if let Some(list) = cx.vm.inst_pages.get(&page_key(target, page)) {
            for g in list.clone() {
                refresh(cx, g);
            }
        }
        if page >= last {
            break;
        }
        page += gf100::PAGE_SIZE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_offsets_decode() {
        assert_eq!(table_index(pfifo::chan_table(0)), Some((0, false)));
        assert_eq!(table_index(pfifo::chan_state(127)), Some((127, true)));
        assert_eq!(table_index(pfifo::chan_table(128)), None);
        assert_eq!(table_index(0x2fff), None);
        assert_eq!(page_key(Target::SysCoherent, 0x1234), (true, 0x1000));
        assert_eq!(
            page_key(Target::SysNonCoherent, 0x1fff),
            page_key(Target::SysCoherent, 0x1000)
        );
    }
}
