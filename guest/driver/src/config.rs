//! Driver configuration: how fences are waited for, where the driver places its structures, and
//! how long it waits before declaring the hardware stuck. The defaults follow nouveau on GF100.

/// How the driver waits for a fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FenceMode {
    /// Poll the semaphore with back-off delays (nouveau `nouveau_fence_wait` busy path).
    #[default]
    Poll,
    /// Emit NON_STALL_INTERRUPT after the release and sleep in `Platform::wait_for_interrupt`
    /// (nouveau's non-stall "uevent" path). Falls back to [`FenceMode::Poll`] when the platform
    /// has no interrupts.
    Interrupt,
}

/// Where a driver-owned buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemLocation {
    /// In VRAM; the CPU reaches it through a BAR1 mapping.
    Vram,
    /// In guest RAM (GPU SYSRAM coherent pages); the CPU reaches it directly.
    Sysram,
}

/// How the driver reaches instance memory (instance blocks, page tables, runlists) once BAR3 is
/// up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InstAccess {
    /// Through the BAR3 aperture, each object mapped into the BAR3 VM (nouveau `nv50_instmem`
    /// fast path). Falls back to PRAMIN for an object when BAR3 space runs out, as nouveau does.
    #[default]
    Bar3,
    /// Always through the PRAMIN window at BAR0 0x700000 (nouveau's slow path).
    Pramin,
}

/// Size of the semaphore release used for fences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReleaseSize {
    /// 16-byte release: payload, 0, 64-bit GPU timestamp (what nouveau's `WRITE_LONG` does).
    #[default]
    Long,
    /// 4-byte release: payload only.
    Short,
}

/// Whether the driver uses the para-virtual page-table interface (`gf100::pv`) of a vGPU for
/// channel address spaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Paravirt {
    /// Never: page-directory and page-table entries are written to instance memory and the TLB
    /// is invalidated through registers, as nouveau does (the ID register is not even read).
    Off,
    /// Use the interface iff its ID register reads `gf100::pv::MAGIC` (on bare hardware or the
    /// simulator it reads the bad-register code, and the driver silently stays native).
    #[default]
    Auto,
    /// Use the interface; [`crate::Gpu::init`] fails with
    /// [`crate::DriverError::ParavirtUnavailable`] if the vGPU does not offer it.
    Required,
}

/// Driver configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverConfig {
    /// How fences are waited for.
    pub fence_mode: FenceMode,
    /// Budget of every wait for the hardware, in nanoseconds of requested delay.
    pub timeout_ns: u64,
    /// Where fence semaphores live (nouveau: a VRAM buffer read through BAR1).
    pub semaphore_mem: MemLocation,
    /// Where pushbuffers and the GPFIFO ring live (nouveau 3.x: GART, i.e. system memory).
    pub pushbuf_mem: MemLocation,
    /// How instance memory is reached after BAR3 bring-up.
    pub inst_access: InstAccess,
    /// Size of the channel-fence releases (the timestamp queries of the workloads are always
    /// 16 bytes).
    pub fence_release: ReleaseSize,
    /// Map VRAM buffers of at least 128 KiB with large pages.
    pub large_pages: bool,
    /// GPFIFO ring entries per channel (power of two, 2..=32768; nouveau: 1024).
    pub gpfifo_entries: u32,
    /// Pushbuffer bytes per channel (multiple of 4 KiB; nouveau: 64 KiB).
    pub pushbuf_bytes: u64,
    /// Para-virtual page tables for channel address spaces (default: when offered).
    pub paravirt: Paravirt,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            fence_mode: FenceMode::Poll,
            timeout_ns: 10_000_000_000,
            semaphore_mem: MemLocation::Vram,
            pushbuf_mem: MemLocation::Sysram,
            inst_access: InstAccess::Bar3,
            fence_release: ReleaseSize::Long,
            large_pages: true,
            gpfifo_entries: 1024,
            pushbuf_bytes: 0x10000,
            paravirt: Paravirt::Auto,
        }
    }
}
