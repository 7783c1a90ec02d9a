//! Destroying a VM ([`HostShared::destroy`]): its channels taken off the GPU, what the GPU
//! reported for them routed to it, its work dropped, its shadows freed into the quarantine and
//! its partition returned — the GPU-wide part under the host lock, the scrub of its VRAM slice
//! and the unmapping of its DMA windows after it (nobody else is involved in them), then the
//! partition freed in a second short hold.

use crate::addr::{HostVram, Iova};
use crate::sched::VmId;
use crate::vgpu::VmCx;

use super::{apply_lines, reclaim, HostError, HostShared};

impl HostShared {
    /// Destroys VM `id`: takes its channels off the GPU (an operation still running is aborted
    /// by an engine reset, so nothing of it lands later), routes what the GPU reported for them
    /// to the VM, unbinds them, removes them from the runlist, drops its work, frees its
    /// shadows, scrubs its VRAM, unmaps its DMA windows and frees its partition.
    pub(crate) fn destroy(&self, id: VmId) -> Result<(), HostError> {
        let (lines, release) = {
            let mut guard = self.lock();
            let st = &mut *guard;
            let phys = &*self.phys;
            if !st.vms.contains_key(&id) {
                return Err(HostError::NoSuchVm(id));
            }
            // What the GPU reported so far is routed while the VM still owns its channels.
            if self.irq.is_asserted() {
                crate::host::irq_route::service(st, phys);
            }
            let all_off = match st.vms.get_mut(&id) {
                Some(mut vm) => {
                    let mut cx = VmCx::new(phys, &mut st.hyp, &st.layout, &mut vm);
                    let off = crate::channels::unbind_all(&mut cx.chan());
                    let (sh, mut scx) = cx.shadow();
                    sh.destroy(&mut scx);
                    off
                }
                None => true,
            };
            // Faults and errors the aborted work raised are still this VM's.
            if self.irq.is_asserted() {
                crate::host::irq_route::service(st, phys);
            }
            // What its channels ran is the VM's; the next owner of the channels starts from
            // zero.
            let now = st.now(phys);
            st.charge_ran(phys, id, now);
            let Some(cell) = st.vms.remove(&id) else {
                return Err(HostError::NoSuchVm(id));
            };
            self.fast_gone.fetch_add(
                cell.fast_accesses
                    .load(std::sync::atomic::Ordering::Relaxed),
                std::sync::atomic::Ordering::Relaxed,
            );
            let mut vm = cell.lock();
            // Its vGPU's fast path may still reach the cell: it finds the VM gone.
            vm.gone = true;
            let dropped = st.sched.remove_vm(id);
            let before = st.inflight.len();
            st.inflight.retain(|f| f.sub.vm != id);
            if st.inflight.len() != before {
                let now = st.now(phys);
                st.acct.retired(id, now, false);
            }
            st.acct.remove_vm(id);
            st.counters.aborted += (dropped + before - st.inflight.len()) as u64;
            st.nonstall.remove(&id);
            st.frozen.remove(&id);
            crate::host::runlist::submit_physical(st, phys);
            // The VM's channels are off the GPU: its shadows leave the quarantine now.
            reclaim::reclaim(st, phys, &self.irq);
            let release = if all_off {
                for o in st.part.owner.iter_mut().filter(|o| **o == Some(id)) {
                    *o = None;
                }
                // Scrubbed and unmapped after this hold (no VM can reach them: the VM is out
                // of the map and its channels are off the GPU), freed in a second one.
                Some(Release {
                    slice: (vm.mem.slice.base, vm.mem.slice.size),
                    dma_windows: std::mem::take(&mut vm.dma_windows),
                    chans: (vm.chan_base, vm.nchan()),
                    window: vm.window,
                })
            } else {
                // Work of the VM may still be running: its slice, channels and DMA window
                // are never handed to another VM (leaked rather than shared).
                st.counters.withheld_partitions += 1;
                log::error!(
                    "{id}: a channel could not be taken off the GPU; its VRAM slice, channels \
                     and DMA window are withheld from reuse"
                );
                None
            };
            st.part.bar1.free(vm.bar1_arena.0, vm.bar1_arena.1);
            st.part.bar3.free(vm.bar3_arena.0, vm.bar3_arena.1);
            st.sched.remove_vm(id);
            log::info!("{id} ('{}') destroyed", vm.profile.name);
            // The VM's line is left deasserted.
            vm.line_seq += 1;
            (vec![(vm.line.clone(), vm.line_seq, false)], release)
        };
        apply_lines(lines);
        let Some(r) = release else {
            return Ok(());
        };
        // Scrubbing a slice (up to ~1 ms for a VM that used its VRAM) and unmapping its DMA
        // windows involve nobody else: done without the host lock, so that other VMs' exits
        // do not wait for them (measured: the longest hold next to a 1024² `mmul` neighbour
        // was its destruction's scrub). The slice is handed out again only after it.
        self.phys.fill_vram(r.slice.0, r.slice.1, 0);
        for w in r.dma_windows {
            if let Err(e) = self.phys.unmap_dma(w) {
                log::warn!("{id}: unmapping DMA window {w}: {e}");
            }
        }
        let mut st = self.lock();
        st.part.vram.free(r.slice.0.raw(), r.slice.1);
        st.part
            .chans
            .free(u64::from(r.chans.0), u64::from(r.chans.1));
        st.part.iova.free(r.window.0, r.window.1);
        Ok(())
    }
}

/// What a destroyed VM leaves to scrub, unmap and free once the host lock is released.
struct Release {
    slice: (HostVram, u64),
    dma_windows: Vec<Iova>,
    chans: (u32, u32),
    window: (u64, u64),
}
