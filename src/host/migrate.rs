//! Quiescing a vGPU, reading its device state and VRAM, and rebuilding it on another host: the
//! library half of snapshot, restore and live migration (`docs/migration.md`; the stream format
//! and the copy rounds are in `crate::migrate`).
//!
//! - [`GpuHost::quiesce`]: the VM's doorbells stop reaching the scheduler, its queued
//!   submissions are withdrawn (they stay in its rings: GP_PUT is ahead of what the GPU was
//!   given), and the host services the GPU until none of its work is in flight and no engine
//!   is busy with one of its channels — bounded: a channel still busy at the deadline is
//!   reported ([`MigrateError::Hung`]) and the VM is left frozen for the caller to resume
//!   (abort) or destroy. The VMM must not run the guest's vCPUs while the VM is quiesced.
//! - [`GpuHost::device_state`]: the [`DeviceState`] of a quiesced VM.
//! - [`GpuHost::resume`]: rings again every channel whose GP_PUT is ahead.
//! - [`Vgpu::start_dirty_log`], [`Vgpu::vram_page`], [`Vgpu::restore_vram`]: the VRAM side.
//! - [`GpuHost::apply_device_state`]: replays a state into a vGPU created from the same
//!   profile (all checks first; on error the caller destroys the vGPU and the host is as before).

use std::sync::Arc;

use gf100::pfifo;

use crate::clock::Clock;
use crate::guest_mem::DirtyLog;
use crate::phys::PhysicalGpu;
use crate::sched::VmId;
use crate::vgpu::{state, DeviceState, StateError, Vgpu, VmCx};

use super::{GpuHost, HostShared};

/// Why a migration step failed. The source VM keeps running (or frozen, for
/// [`MigrateError::Hung`], until the caller resumes it).
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The vGPU does not belong to this host or was destroyed.
    #[error("no such vGPU on this host")]
    NoSuchVm,
    /// The VM was not quiesced first.
    #[error("the VM is not quiesced")]
    NotQuiesced,
    /// Work of the VM was still on the GPU when the wait ended.
    #[error("{vm}: channels {chans:?} still had work on the GPU after {waited_ns} ns")]
    Hung {
        /// The VM.
        vm: VmId,
        /// Its guest channels with work in flight.
        chans: Vec<u32>,
        /// How long the host waited (on the clock given).
        waited_ns: u64,
    },
    /// The device state was refused.
    #[error(transparent)]
    State(#[from] StateError),
    /// A VRAM page outside the VM's slice, or of the wrong size.
    #[error("VRAM write at {offset:#x} of {len} bytes is outside the {slice:#x}-byte slice")]
    OutOfSlice {
        /// Offset in the slice.
        offset: u64,
        /// Bytes.
        len: u64,
        /// Slice size.
        slice: u64,
    },
}

/// What quiescing a VM took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quiesced {
    /// Submissions withdrawn from the scheduler (still in the guest's rings).
    pub withdrawn: usize,
    /// Time waited for work in flight to finish, on the clock given.
    pub waited_ns: u64,
}

impl GpuHost {
    fn owns(&self, v: &Vgpu) -> Result<(), MigrateError> {
        if std::ptr::addr_eq(Arc::as_ptr(&self.shared), Arc::as_ptr(&v.port)) {
            Ok(())
        } else {
            Err(MigrateError::NoSuchVm)
        }
    }

    /// Stops the VM's work from reaching the GPU and waits (at most `max_wait_ns` on `clock`)
    /// until none of it is in flight. A simulated clock is stepped to the GPU's next event.
    pub fn quiesce(
        &self,
        v: &Vgpu,
        clock: &dyn Clock,
        max_wait_ns: u64,
    ) -> Result<Quiesced, MigrateError> {
        self.owns(v)?;
        let id = v.id();
        let withdrawn = {
            let mut st = self.shared.lock();
            let n = match st.vms.get(&id) {
                Some(vm) => vm.nchan(),
                None => return Err(MigrateError::NoSuchVm),
            };
            st.frozen.insert(id);
            (0..n).map(|g| st.sched.remove_channel(id, g)).sum()
        };
        let start = clock.now_ns();
        loop {
            self.shared.poll();
            let busy = inflight_chans(&self.shared, id);
            let waited_ns = clock.now_ns().saturating_sub(start);
            if busy.is_empty() {
                log::info!("{id}: quiesced ({withdrawn} submissions withdrawn, {waited_ns} ns)");
                return Ok(Quiesced {
                    withdrawn,
                    waited_ns,
                });
            }
            if waited_ns >= max_wait_ns {
                log::warn!("{id}: channels {busy:?} still busy after {waited_ns} ns");
                return Err(MigrateError::Hung {
                    vm: id,
                    chans: busy,
                    waited_ns,
                });
            }
            // Let the GPU get on with it: a simulated clock jumps to its next event.
            let next = self.shared.next_event_ns();
            let step = next
                .map(|t| t.saturating_sub(clock.now_ns()))
                .unwrap_or(10_000)
                .clamp(1_000, 1_000_000)
                .min(max_wait_ns - waited_ns);
            clock.wait_ns(step.max(1));
        }
    }

    /// Lets a quiesced VM's work reach the GPU again: every bound channel whose GP_PUT is ahead
    /// of what the GPU was given is rung.
    pub fn resume(&self, v: &Vgpu) -> Result<(), MigrateError> {
        self.owns(v)?;
        let id = v.id();
        {
            let mut guard = self.shared.lock();
            let st = &mut *guard;
            st.frozen.remove(&id);
            let ahead: Vec<u32> = match st.vms.get(&id) {
                Some(vm) => (0..vm.nchan())
                    .filter(|&g| {
                        let c = &vm.chans[g as usize];
                        c.bound.is_some() && !c.killed && c.gp_put != c.phys_put
                    })
                    .collect(),
                None => return Err(MigrateError::NoSuchVm),
            };
            for g in ahead {
                super::dispatch::doorbell(st, &*self.shared.phys, id, g);
            }
        }
        self.shared.poll();
        Ok(())
    }

    /// The device state of quiesced VM `v`.
    pub fn device_state(&self, v: &Vgpu) -> Result<DeviceState, MigrateError> {
        self.owns(v)?;
        let id = v.id();
        // One hold of the lock: quiesced, nothing in flight, and captured as one moment.
        let mut guard = self.shared.lock();
        let st = &mut *guard;
        if !st.frozen.contains(&id) || st.inflight.iter().any(|f| f.sub.vm == id) {
            return Err(MigrateError::NotQuiesced);
        }
        let mut vm = st.vms.get_mut(&id).ok_or(MigrateError::NoSuchVm)?;
        let mut cx = VmCx::new(&*self.shared.phys, &mut st.hyp, &st.layout, &mut vm);
        state::capture(&mut cx).map_err(MigrateError::State)
    }

    /// Replays `st` into `v`, a vGPU of this host created from the same profile whose VRAM
    /// already holds the snapshot's pages and whose guest RAM is attached. On error nothing of
    /// `v` is trustworthy: destroy it (the host is then as before).
    pub fn apply_device_state(&self, v: &Vgpu, st: &DeviceState) -> Result<(), MigrateError> {
        self.owns(v)?;
        self.shared
            .access(v.id(), |cx| state::apply(cx, st))
            .ok_or(MigrateError::NoSuchVm)?
            .map_err(MigrateError::State)
    }
}

/// The VM's guest channels with work on the GPU: a submission in flight, or an engine busy
/// with the channel (work of a channel the guest disabled after its submission, or one that
/// resumed from an acquire, runs outside the scheduler's accounting).
fn inflight_chans(shared: &HostShared, id: VmId) -> Vec<u32> {
    let st = shared.lock();
    let mut v: Vec<u32> = st
        .inflight
        .iter()
        .filter(|f| f.sub.vm == id)
        .map(|f| f.sub.guest_chid)
        .collect();
    if let Some(vm) = st.vms.get(&id) {
        let base = vm.phys_chid(0);
        for e in 0..pfifo::ENGINES {
            let s = shared.phys.read_reg(pfifo::eng_state(e));
            let p = s & pfifo::ENG_STATE_CHID_MASK;
            if s & pfifo::ENG_STATE_BUSY != 0 && (base..base + vm.nchan()).contains(&p) {
                v.push(p - base);
            }
        }
    }
    v.sort_unstable();
    v.dedup();
    v
}

impl Vgpu {
    /// Starts the migration dirty log of the VM's VRAM ([`DirtyLog`]): BAR pages are no longer
    /// mapped straight into the guest (the direct-map plan is empty; its generation moves) and
    /// every shadow page table is rebuilt so that each page the GPU can reach is recorded.
    /// Returns the log (shared with the device model until [`Vgpu::stop_dirty_log`]).
    pub fn start_dirty_log(&self) -> Option<Arc<DirtyLog>> {
        self.port.access(self.id, |cx| {
            let ram_end = cx.vm.mem.ram.as_ref().map_or(0, |r| r.end());
            let log = Arc::new(DirtyLog::new(cx.vm.mem.slice.size, ram_end));
            cx.vm.mem.log = Some(log.clone());
            cx.vm.map_gen += 1;
            let pds = {
                let (sh, mut scx) = cx.shadow();
                sh.resync(&mut scx, None)
            };
            cx.phys_tlb_flush(&pds);
            log
        })
    }

    /// Ends the dirty log (direct mapping may resume).
    pub fn stop_dirty_log(&self) {
        self.port.access(self.id, |cx| {
            cx.vm.mem.log = None;
            cx.vm.map_gen += 1;
        });
    }

    /// Reads `buf.len()` bytes of the VM's VRAM slice at `offset` (no guest exit is counted).
    pub fn vram_read(&self, offset: u64, buf: &mut [u8]) -> Result<(), MigrateError> {
        let slice = self.slice;
        let len = buf.len() as u64;
        if offset.checked_add(len).is_none_or(|e| e > slice.size) {
            return Err(MigrateError::OutOfSlice {
                offset,
                len,
                slice: slice.size,
            });
        }
        self.port.phys().read_vram(slice.base.offset(offset), buf);
        Ok(())
    }

    /// The ranges `(offset, len)` of the slice the GPU holds as written, if it can tell.
    pub fn vram_resident(&self) -> Option<Vec<(u64, u64)>> {
        let slice = self.slice;
        let phys: &dyn PhysicalGpu = &**self.port.phys();
        phys.vram_resident_ranges(slice.base, slice.size).map(|r| {
            r.into_iter()
                .map(|(a, l)| (a - slice.base.raw(), l))
                .collect()
        })
    }

    /// Writes `data` into the VM's VRAM slice at `offset` (a restore; validated, no guest
    /// exit is counted, the dirty log is not touched).
    pub fn restore_vram(&self, offset: u64, data: &[u8]) -> Result<(), MigrateError> {
        let slice = self.slice;
        let len = data.len() as u64;
        if offset.checked_add(len).is_none_or(|e| e > slice.size) {
            return Err(MigrateError::OutOfSlice {
                offset,
                len,
                slice: slice.size,
            });
        }
        self.port.phys().write_vram(slice.base.offset(offset), data);
        Ok(())
    }
}
