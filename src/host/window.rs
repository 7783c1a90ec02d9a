//! Resizing a VM's DMA (IOVA) window after its creation: for a transport that creates the vGPU
//! before it knows the guest's RAM (a vfio-user client sends its DMA_MAPs after connecting).
//!
//! A window is a naturally aligned power-of-two range of the IOVA space; GPA `g` of the VM's
//! RAM is at IOVA `window base + g`. Moving the window is only sound while no address inside
//! the old one can still be used, because the old range may be handed to another VM at once:
//!
//! - the physical GPU's DMA windows: none mapped, and no RAM attached (the caller detaches
//!   first, [`crate::vgpu::Vgpu::detach_guest_memory`], and attaches again after);
//! - shadow page tables, the only structures that hold an IOVA (a SYSRAM PTE the shadow
//!   translated): they exist only for page directories of bound channels (`channels::bind`
//!   attaches them, unbinding detaches them), so no guest channel may be bound;
//! - shadows already freed but still in the hypervisor-VRAM quarantine, which a channel not yet
//!   seen off the GPU may still walk: none of the VM's channels may appear in it;
//! - work of the VM queued, in flight, quiesced for a migration or with a dirty log running.
//!
//! A VM that passes has never let the GPU use the old window (or everything that did has been
//! torn down), so the window is freed and the new one allocated first fit under the host lock;
//! if no aligned range is free the VM keeps its old window and the caller gets
//! [`HostError::NoLargerDmaWindow`] with the sizes.

use super::{ram_window, GpuHost, HostError};
use crate::addr::Iova;
use crate::vgpu::Vgpu;

impl GpuHost {
    /// The DMA window of `v`: (IOVA base, size in bytes).
    pub fn dma_window(&self, v: &Vgpu) -> Result<(u64, u64), HostError> {
        self.check_owner(v)?;
        let st = self.shared.lock();
        st.vms
            .get(&v.id)
            .map(|vm| vm.window)
            .ok_or(HostError::NoSuchVm(v.id))
    }

    /// Gives `v` the DMA window its RAM needs when the RAM ends at guest-physical address
    /// `ram_end`: [`super::dma_window_for`]`(ram_end)`, at most [`super::MAX_DMA_WINDOW`].
    /// Returns the window (IOVA base, size); a VM whose window has that size already keeps it.
    ///
    /// Refused, with nothing changed, while anything may use the current window (see the
    /// module documentation: RAM attached, a channel bound, quarantined shadows of its
    /// channels, work queued or in flight, a migration), or when the IOVA space has no free
    /// aligned range of the new size ([`HostError::NoLargerDmaWindow`]).
    pub fn resize_dma_window(&self, v: &Vgpu, ram_end: u64) -> Result<(u64, u64), HostError> {
        self.check_owner(v)?;
        let window = ram_window(ram_end)?;
        let id = v.id;
        let mut guard = self.shared.lock();
        let st = &mut *guard;
        let vms = st.vms.len();
        let Some(mut vm) = st.vms.get_mut(&id) else {
            return Err(HostError::NoSuchVm(id));
        };
        let (old_base, old_size) = vm.window;
        if old_size == window {
            return Ok(vm.window);
        }
        let in_use = |why| Err(HostError::DmaWindowInUse { vm: id, why });
        if vm.mem.ram.is_some() || !vm.dma_windows.is_empty() {
            return in_use("guest RAM is attached through it (detach it first)");
        }
        if vm.chans.iter().any(|c| c.bound.is_some()) || vm.shadow.rebuilding() {
            return in_use("a channel is bound: its shadow page tables may hold addresses in it");
        }
        let chans = vm.chan_base..vm.chan_base + vm.nchan();
        if !vm.retired_insts.is_empty()
            || st
                .hyp
                .retired()
                .iter()
                .any(|r| r.chans.iter().any(|c| chans.contains(c)))
        {
            return in_use(
                "shadows of its channels are still in quarantine (the GPU may walk them)",
            );
        }
        if vm.mem.log.is_some() || st.frozen.contains(&id) {
            return in_use("a snapshot or migration is in progress");
        }
        if st.inflight.iter().any(|f| f.sub.vm == id) {
            return in_use("work of the VM is on the GPU");
        }
        // Free, then allocate first fit, on a copy: a failure leaves the allocator (and the
        // VM's window) exactly as they were.
        let mut iova = st.part.iova.clone();
        if !iova.free(old_base, old_size) {
            return in_use("its window is not allocated (an inconsistent host)");
        }
        let Some(base) = iova.alloc(window, window) else {
            return Err(HostError::NoLargerDmaWindow {
                vm: id,
                ram_end,
                window,
                current: old_size,
                free: iova.size() - iova.used(),
                vms,
            });
        };
        vm.window = (base, window);
        vm.mem.iova_base = Iova(base);
        drop(vm);
        st.part.iova = iova;
        log::info!(
            "{id}: DMA window {old_base:#x}+{old_size:#x} -> {base:#x}+{window:#x} (guest RAM ends at {ram_end:#x})"
        );
        Ok((base, window))
    }

    /// `v` is a vGPU of this host.
    fn check_owner(&self, v: &Vgpu) -> Result<(), HostError> {
        if std::ptr::addr_eq(
            std::sync::Arc::as_ptr(&self.shared),
            std::sync::Arc::as_ptr(&v.port),
        ) {
            Ok(())
        } else {
            Err(HostError::NoSuchVm(v.id))
        }
    }
}

#[cfg(test)]
mod tests;
