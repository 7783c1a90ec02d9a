//! Access taps: a hook that sees every BAR access of one vGPU, in the order the device model
//! executes it, and runs the access itself. A VMM installs one to record its guests' MMIO
//! traces (the KVM VMM's `--record`, `crate::trace::record::TapRecorder`) without wrapping the
//! guest driver, as Linux's mmiotrace hooks the kernel's `ioremap`ped accesses.

use crate::phys::Bar;

/// Sees and performs every BAR access of a vGPU (installed with
/// [`super::Vgpu::set_access_tap`]). Each method must call `perform` exactly once; whatever the
/// tap does before and after it (under its own lock, for a recorder) brackets the access.
pub trait AccessTap: Send + Sync {
    /// A read of `data.len()` bytes of `bar` at `offset`; `perform` fills `data`.
    fn read(&self, bar: Bar, offset: u64, data: &mut [u8], perform: &mut dyn FnMut(&mut [u8]));

    /// A write of `data` to `bar` at `offset`; `perform` applies it.
    fn write(&self, bar: Bar, offset: u64, data: &[u8], perform: &mut dyn FnMut(&[u8]));
}
