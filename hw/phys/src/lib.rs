//! The physical GPU underneath every virtual one: the [`PhysicalGpu`] trait, and the types
//! every layer above shares with it — address newtypes ([`addr`]), interrupt lines ([`irq`])
//! and the time base ([`clock`]).
//!
//! This crate is the bottom of gpuvm's device-model stack (above only `gf100`). Its backends are
//! crates of their own: `gpuvm-sim` (a software GF100, the embedded default, used by every
//! test) and `gpuvm-vfio` (a real GF100 bound to vfio-pci). The device model (`gpuvm`) talks to
//! the GPU only through this trait. All methods take `&self`: backends are internally
//! synchronized so that many vCPU threads may call them at once.
#![deny(missing_docs)]

pub mod addr;
pub mod clock;
pub mod irq;

use std::sync::Arc;

use vm_memory::GuestMemoryMmap;

pub use gf100::pci::Bar;

use crate::addr::{Gpa, HostVram, Iova};
use crate::irq::IrqLine;

/// Why a channel's GPU-held state could not be saved or restored.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ChannelStateError {
    /// The backend cannot save or restore channel state (a real GPU: not implemented).
    #[error("this GPU backend cannot save or restore channel state")]
    Unsupported,
    /// The channel is executing work (quiesce it first).
    #[error("physical channel {0} is busy")]
    Busy(u32),
    /// No such channel, or it is not bound.
    #[error("physical channel {0} does not exist or is not bound")]
    NoChannel(u32),
    /// The state blob is malformed.
    #[error("invalid channel state: {0}")]
    Invalid(String),
}

/// Why a DMA window could not be registered.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DmaError {
    /// The window is empty or its end overflows.
    #[error("DMA window of {len:#x} bytes at IOVA {iova} is empty or wraps")]
    Empty {
        /// Start of the window.
        iova: Iova,
        /// Length of the window.
        len: u64,
    },
    /// The window overlaps one already registered.
    #[error("DMA window at IOVA {iova} overlaps an existing window")]
    Overlap {
        /// Start of the rejected window.
        iova: Iova,
    },
    /// The guest-physical range is not entirely backed by the guest memory.
    #[error("guest range at {gpa} of {len:#x} bytes is not backed by guest memory")]
    NotBacked {
        /// Start of the guest range.
        gpa: Gpa,
        /// Length of the guest range.
        len: u64,
    },
    /// No window starts at that IOVA.
    #[error("no DMA window at IOVA {0}")]
    NoSuchWindow(Iova),
    /// An IOMMU maps whole pages: the IOVA, length and guest address must be page-aligned.
    #[error("DMA window of {len:#x} bytes at IOVA {iova} is not page-aligned")]
    Unaligned {
        /// Start of the window.
        iova: Iova,
        /// Length of the window.
        len: u64,
    },
    /// The IOMMU (VFIO) refused the mapping or unmapping.
    #[error("IOMMU refused the DMA window at IOVA {iova}: {reason}")]
    Iommu {
        /// Start of the window.
        iova: Iova,
        /// The VFIO error.
        reason: String,
    },
}

impl DmaError {
    /// The end of the window `[iova, iova + len)` that maps guest RAM from `gpa`: the checks
    /// every backend makes first (not empty, neither range wraps).
    pub fn window_end(iova: Iova, len: u64, gpa: Gpa) -> Result<u64, DmaError> {
        let end = iova
            .raw()
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(DmaError::Empty { iova, len })?;
        gpa.raw()
            .checked_add(len)
            .ok_or(DmaError::NotBacked { gpa, len })?;
        Ok(end)
    }
}

/// A semaphore acquire a channel waits on: the GPU virtual address of the semaphore (in the
/// channel's address space), the payload and the operation (`gf100::host::SEM_OP_ACQ*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SemAcquire {
    /// GPU virtual address of the 32-bit semaphore value.
    pub va: u64,
    /// The value the operation compares with.
    pub payload: u32,
    /// `gf100::host::SEM_OP_ACQUIRE`, `SEM_OP_ACQ_GEQ` or `SEM_OP_ACQ_AND`.
    pub op: u32,
}

/// What [`PhysicalGpu::channel_acquire`] knows of a channel's acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireState {
    /// The channel waits on no acquire.
    None,
    /// The channel waits on this acquire.
    Waiting(SemAcquire),
    /// The backend cannot tell.
    Unknown,
}

/// Counters every backend keeps. Read with [`PhysicalGpu::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct GpuStats {
    /// BAR0 register reads.
    pub mmio_reads: u64,
    /// BAR0 register writes.
    pub mmio_writes: u64,
    /// BAR1/BAR3 aperture reads.
    pub aperture_reads: u64,
    /// BAR1/BAR3 aperture writes.
    pub aperture_writes: u64,
    /// Reads of registers the GPU does not implement (answered with the bad-register code).
    pub bad_register_reads: u64,
    /// Writes to registers the GPU does not implement (dropped).
    pub bad_register_writes: u64,
    /// MMU faults reported (channel, BAR1 and BAR3 accesses).
    pub mmu_faults: u64,
    /// PBDMA errors (invalid GPFIFO entries, illegal commands/methods, bad semaphores).
    pub pbdma_errors: u64,
    /// Runlist / channel-table errors.
    pub sched_errors: u64,
    /// Physical accesses that reached no memory: system memory outside every DMA window, VRAM
    /// beyond its end (dropped writes, reads of all-ones).
    pub dma_errors: u64,
    /// MMU translations answered from the TLB.
    pub tlb_hits: u64,
    /// MMU translations that walked the page tables.
    pub tlb_misses: u64,
    /// TLB flushes performed (register or MEM_OP).
    pub tlb_flushes: u64,
    /// GPFIFO entries fetched.
    pub gpfifo_entries: u64,
    /// Methods executed.
    pub methods: u64,
    /// Engine operations (copies, kernel launches) completed.
    pub engine_ops: u64,
    /// Memory-to-memory format (class 0x9039) transfers PGRAPH executed: memory launches and
    /// completed inline transfers.
    pub m2mf_transfers: u64,
    /// Bytes those transfers were asked to move (a faulting transfer moves fewer).
    pub m2mf_bytes: u64,
    /// Modeled time the GPU was busy (command fetch and engine operations), in ns.
    pub busy_ns: u64,
    /// Engine operations aborted by an engine reset (PMC ENABLE bit cleared while the engine
    /// ran them): the watchdog's recovery of a hung engine.
    pub engine_aborts: u64,
}

/// Where a backend's VRAM lives in this process: a shared mapping a VMM may map into a guest
/// (BAR remap: KVM memory slots over `host_addr`) and, if it is a file, the file a VMM may hand
/// to another process (vfio-user). Valid as long as the backend exists.
#[derive(Debug, Clone)]
pub struct VramBacking {
    /// The file holding VRAM (a memfd for the simulator), if any; VRAM address `a` is at file
    /// offset `file_offset + a`.
    pub file: Option<Arc<std::fs::File>>,
    /// File offset of VRAM address 0.
    pub file_offset: u64,
    /// Host virtual address of VRAM address 0 (a `MAP_SHARED` mapping).
    pub host_addr: u64,
    /// Bytes mapped (at least the VRAM size, rounded up to host pages).
    pub len: u64,
}

/// A GF100, real or simulated.
pub trait PhysicalGpu: Send + Sync {
    /// Reads a 32-bit BAR0 register. Unknown registers read as [`gf100::BAD_REGISTER`].
    fn read_reg(&self, offset: u32) -> u32;

    /// Writes a 32-bit BAR0 register. Writes to unknown registers are dropped and counted.
    fn write_reg(&self, offset: u32, value: u32);

    /// Reads `data.len()` (1, 2, 4 or 8) bytes from BAR1 or BAR3 at `offset`, through that BAR's
    /// VM. A faulting access reads as all-ones bytes and raises an MMU fault.
    fn read_aperture(&self, bar: Bar, offset: u64, data: &mut [u8]);

    /// Writes `data` (1, 2, 4 or 8 bytes) to BAR1 or BAR3 at `offset`, through that BAR's VM.
    fn write_aperture(&self, bar: Bar, offset: u64, data: &[u8]);

    /// Size of the GPU's VRAM in bytes.
    fn vram_size(&self) -> u64;

    /// Reads VRAM directly (the hypervisor's own path: shadow tables, scrubbing). Bytes beyond
    /// the end of VRAM read as zero.
    fn read_vram(&self, addr: HostVram, data: &mut [u8]);

    /// Writes VRAM directly. Bytes beyond the end of VRAM are dropped.
    fn write_vram(&self, addr: HostVram, data: &[u8]);

    /// Fills `len` bytes of VRAM from `addr` with `byte` (scrubbing a destroyed VM's slice,
    /// zeroing hypervisor structures). Bytes beyond the end of VRAM are dropped. The default
    /// writes in 64 KiB pieces through [`PhysicalGpu::write_vram`].
    fn fill_vram(&self, addr: HostVram, len: u64, byte: u8) {
        const PIECE: u64 = 64 * 1024;
        let buf = [byte; PIECE as usize];
        let end = addr.raw().saturating_add(len).min(self.vram_size());
        let mut a = addr.raw();
        while a < end {
            let n = (end - a).min(PIECE);
            self.write_vram(HostVram(a), &buf[..n as usize]);
            a += n;
        }
    }

    /// Bytes of `[addr, addr + len)` the backend holds as written (operators' "VRAM in use"
    /// for a slice: pages written by the guest or the GPU and not scrubbed since), if the
    /// backend can tell. The simulator can (its VRAM is allocated on first write); a real
    /// GPU's VRAM is always resident and a full-virtualization model does not see the guest
    /// driver's allocator, so the default is `None`.
    fn vram_resident_bytes(&self, _addr: HostVram, _len: u64) -> Option<u64> {
        None
    }

    /// The ranges `(start, len)` of `[addr, addr + len)` the backend holds as written, in
    /// order, if it can tell (see [`PhysicalGpu::vram_resident_bytes`]); `None`: every byte
    /// may hold data. Migration copies only these.
    fn vram_resident_ranges(&self, _addr: HostVram, _len: u64) -> Option<Vec<(u64, u64)>> {
        None
    }

    /// The state of physical channel `chid` that lives in the GPU rather than in memory (on
    /// hardware: what a context switch saves to RAMFC and the engine contexts), as an opaque
    /// blob [`PhysicalGpu::restore_channel`] of the same backend accepts — including a
    /// pushbuffer segment or semaphore acquire the channel is stopped in. Migration takes it
    /// after quiescing the channel's VM; a channel with an operation on the GPU is
    /// [`ChannelStateError::Busy`]. The default: not supported.
    fn save_channel(&self, chid: u32) -> Result<Vec<u8>, ChannelStateError> {
        let _ = chid;
        Err(ChannelStateError::Unsupported)
    }

    /// Loads `state` (from [`PhysicalGpu::save_channel`], untrusted: validated) into bound,
    /// idle physical channel `chid`; a restored segment or acquire continues when the channel
    /// is next scheduled.
    fn restore_channel(&self, chid: u32, state: &[u8]) -> Result<(), ChannelStateError> {
        let _ = (chid, state);
        Err(ChannelStateError::Unsupported)
    }

    /// VRAM as host memory that can be mapped elsewhere, if the backend has it (the simulator
    /// does; a real GPU's VRAM is reachable only through its BARs). Writes through such a
    /// mapping are seen by the backend as writes by the GPU's own memory clients would be.
    fn vram_backing(&self) -> Option<VramBacking> {
        None
    }

    /// Makes guest RAM `[gpa, gpa + len)` of `mem` reachable by the GPU at `[iova, iova + len)`.
    fn map_dma(&self, iova: Iova, len: u64, mem: GuestMemoryMmap, gpa: Gpa)
        -> Result<(), DmaError>;

    /// Removes the DMA window starting at `iova`.
    fn unmap_dma(&self, iova: Iova) -> Result<(), DmaError>;

    /// Connects the GPU's interrupt line (PMC INTR aggregated and enabled).
    fn set_irq_line(&self, line: Arc<dyn IrqLine>);

    /// Lets the GPU make progress up to the current time of its clock: completes engine work
    /// whose modeled duration has elapsed, fetches and executes further work. Every other method
    /// also does this first, so calling it is only needed while nothing else touches the GPU.
    fn poll(&self);

    /// The time at which the GPU will next change state on its own (an engine operation
    /// finishing), or `None` when it is idle. A simulated-clock caller that waits for the GPU
    /// advances its clock to this time.
    fn next_event_ns(&self) -> Option<u64>;

    /// Connects a waker the GPU calls, from a thread of its own and with none of its locks
    /// held, when it finished work there and has nothing more in flight: the simulator's
    /// engine worker, with a real clock, completing the last operation or fetch of what it was
    /// given. Such work may end later than [`PhysicalGpu::next_event_ns`] said (a worker behind
    /// the clock cannot date it), so a caller that sleeps until the next event, or treats the
    /// GPU as quiet until then, learns of the change at once — as a driver learns of a
    /// completion from the GPU's interrupt instead of its next poll. The default never calls
    /// it (a backend whose next event is exact needs no waker).
    fn set_event_waker(&self, waker: Arc<dyn Fn() + Send + Sync>) {
        let _ = waker;
    }

    /// A snapshot of the counters.
    fn stats(&self) -> GpuStats;

    /// GPU time physical channel `chid` has occupied so far, in ns, including the elapsed part
    /// of an operation it is running now; `None` if the backend cannot tell (a real GF100 has
    /// no per-channel time counter: the host then samples ENG_STATE, see
    /// `gpuvm::host::dispatch`). The simulator knows it exactly (MODEL).
    fn channel_busy_ns(&self, chid: u32) -> Option<u64> {
        let _ = chid;
        None
    }

    /// The TLB flush handshake in one call (nouveau `gf100_vmm_invalidate`): wait (at most
    /// `polls` reads) until `VM_CFG` shows a free flush slot, write `TLB_FLUSH_VSPACE` =
    /// `vspace` and `TLB_FLUSH_TRIGGER` = `trigger`, wait until `VM_CFG` shows the flush
    /// queued. Returns whether (a slot was free, the flush was acknowledged). The default does
    /// it through [`PhysicalGpu::read_reg`] and [`PhysicalGpu::write_reg`]; a backend behind one
    /// lock (the simulator) does it under one hold, so a flush no longer queues four times
    /// behind everyone else's calls.
    fn tlb_flush(&self, vspace: u32, trigger: u32, polls: u32) -> (bool, bool) {
        use gf100::pffb;
        let slot =
            (0..polls).any(|_| self.read_reg(pffb::VM_CFG) & pffb::VM_CFG_FLUSH_SLOTS_MASK != 0);
        self.write_reg(pffb::TLB_FLUSH_VSPACE, vspace);
        self.write_reg(pffb::TLB_FLUSH_TRIGGER, trigger);
        let queued =
            (0..polls).any(|_| self.read_reg(pffb::VM_CFG) & pffb::VM_CFG_FLUSH_QUEUED != 0);
        (slot, queued)
    }

    /// PFIFO's ENG_STATE of every engine (`gf100::pfifo::eng_state`), in engine order, in one
    /// call: the host reads them all at every service while work is in flight (which channel
    /// each engine runs), and a backend behind one lock takes it once. The default reads the
    /// registers one by one.
    fn engine_states(&self) -> [u32; gf100::pfifo::ENGINES as usize] {
        std::array::from_fn(|e| self.read_reg(gf100::pfifo::eng_state(e as u32)))
    }

    /// [`PhysicalGpu::channel_busy_ns`] of every channel in `chids`, in order, in one call (a
    /// backend behind one lock takes it once: the host reads a VM's channels at every service);
    /// `None` if the backend cannot tell for one of them.
    fn channels_busy_ns(&self, chids: std::ops::Range<u32>) -> Option<Vec<u64>> {
        chids.map(|c| self.channel_busy_ns(c)).collect()
    }

    /// What physical channel `chid` is waiting on, if it is parked on a semaphore acquire (its
    /// STATE shows ACQUIRE_PENDING). On a GF100 PBDMA holds the acquire in its SEMAPHORE
    /// registers, saved to RAMFC when the channel is switched out; the simulator knows it
    /// exactly. A device model that keeps a parked channel off the GPU until its VM is
    /// scheduled uses this to see when the acquire would succeed, without running the channel.
    /// The default is [`AcquireState::Unknown`] (the host then retries the channel once per
    /// time slice).
    fn channel_acquire(&self, chid: u32) -> AcquireState {
        let _ = chid;
        AcquireState::Unknown
    }

    /// The caller starts a batch of calls it makes while holding its own lock (the host calls
    /// this each time it takes the host lock). A backend that does work of its own inside
    /// calls (the simulator runs engine operations) does at most a fixed budget of it per
    /// batch from then on, instead of per call, so that one batch — one guest exit — holds the
    /// caller's lock for a bounded time however many calls it makes. Real hardware does its
    /// work on its own: the default does nothing.
    fn begin_batch(&self) {}

    /// The batch the caller began with [`PhysicalGpu::begin_batch`] has ended: its lock is
    /// released. A backend with threads of its own may give way to the caller while a batch is
    /// open (the simulator's engine worker yields its CPU between matrix blocks, so a lock
    /// holder it displaced gets the CPU back). The default does nothing.
    fn end_batch(&self) {}
}
