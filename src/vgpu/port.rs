//! The vGPU's one way to the GPU it shares: [`GpuPort`]. The host implements it (its lock, the
//! effects an access queued, the service of the physical GPU, interrupt lines); the per-VM
//! device calls it and never names the host's state, so the dependency runs from the host down
//! to the device and not back up.

use std::sync::Arc;

use crate::phys::PhysicalGpu;
use crate::sched::VmId;

use super::cell::VmCell;
use super::{VmCx, VmState};
use crate::layout::HostLayout;

/// What a vGPU needs from the GPU it shares.
pub(crate) trait GpuPort: Send + Sync {
    /// The physical GPU underneath.
    fn phys(&self) -> &Arc<dyn PhysicalGpu>;

    /// Runs `f` on VM `id` under the GPU lock, then applies the host-level effects the access
    /// queued, services the physical GPU and updates interrupt lines. False (and `f` not run)
    /// if the VM no longer exists.
    #[track_caller]
    fn access_dyn(&self, id: VmId, f: &mut dyn FnMut(&mut VmCx)) -> bool;

    /// Runs `f` on VM `id` under the GPU lock and nothing else (cheap queries).
    #[track_caller]
    fn peek_dyn(&self, id: VmId, f: &mut dyn FnMut(&mut VmCx)) -> bool;

    /// The fast path (`host::local`): runs `f` with only the VM's own state (its cell locked,
    /// not the host) if the host is quiet; true if `f` ran and did the access, false if it must
    /// go through [`GpuPort::access_dyn`].
    fn access_local_dyn(
        &self,
        cell: &VmCell,
        f: &mut dyn FnMut(&dyn PhysicalGpu, &HostLayout, &mut VmState) -> bool,
    ) -> bool;

    /// The fast path for a write whose only effect is within its VM (`host::local`): runs `f`
    /// with only the VM's own state whether or not the host is quiet, and services the host
    /// after it if something is due; true if `f` ran and did the access, false if it must go
    /// through [`GpuPort::access_dyn`].
    fn access_local_write_dyn(
        &self,
        cell: &VmCell,
        f: &mut dyn FnMut(&dyn PhysicalGpu, &HostLayout, &mut VmState) -> bool,
    ) -> bool;

    /// Lets the physical GPU make progress and delivers what it finished — for the VM of
    /// `cell`, which does nothing, under that VM's lock alone, while the host has nothing to
    /// service (`host::local`).
    fn poll_from(&self, cell: &VmCell);

    /// When something next happens on the GPU without anyone touching it.
    fn next_event_ns(&self) -> Option<u64>;

    /// Destroys VM `id` (a no-op if it is already gone).
    fn destroy(&self, id: VmId);
}

impl dyn GpuPort {
    /// [`GpuPort::access_dyn`] with a result.
    #[track_caller]
    pub(crate) fn access<R>(&self, id: VmId, f: impl FnOnce(&mut VmCx) -> R) -> Option<R> {
        let mut f = Some(f);
        let mut out = None;
        self.access_dyn(id, &mut |cx| {
            if let Some(f) = f.take() {
                out = Some(f(cx));
            }
        });
        out
    }

    /// [`GpuPort::peek_dyn`] with a result.
    #[track_caller]
    pub(crate) fn peek<R>(&self, id: VmId, f: impl FnOnce(&mut VmCx) -> R) -> Option<R> {
        let mut f = Some(f);
        let mut out = None;
        self.peek_dyn(id, &mut |cx| {
            if let Some(f) = f.take() {
                out = Some(f(cx));
            }
        });
        out
    }
}
