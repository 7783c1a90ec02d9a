//! gpuvm: full virtualization of an NVIDIA Fermi GF100 GPU (presented as a Quadro 6000) for
//! rust-vmm VMMs, in the style of GPUvm (Suzuki et al., USENIX ATC 2014).
//!
//! The crate layout follows the data flow of one guest access (see `docs/design.md`):
//! MMIO trap -> shadow page tables / shadow channels -> scheduler -> physical GPU.
//!
//! - [`host`]: [`host::GpuHost`] owns the physical GPU, brings it up, carves it into per-VM
//!   partitions and creates [`vgpu::Vgpu`]s.
//! - [`vgpu`]: the per-VM device model a VMM embeds — BAR and config-space access, guest memory,
//!   interrupt line, counters (BAR0 dispatch, PRAMIN/BAR1/BAR3 walked in software, interrupts).
//! - [`mmio`]: the BAR0 region table (deny by default) and PCI configuration space.
//! - [`shadow_pt`]: shadow GPU page tables in four modes.
//! - [`channels`]: channel partitioning, shadow instance blocks, runlist merge, USERD emulation,
//!   the pushbuffer scan of the submission path.
//! - [`sched`]: the `Scheduler` trait, the FIFO, CREDIT and BAND policies, GPU-time accounting.
//! - [`phys`]: the `PhysicalGpu` trait and the simulated GF100.
//! - [`harness`]: the shared guest driver run in-process, natively or in N VMs.
#![deny(missing_docs)]

pub mod addr;
pub mod channels;
pub mod clock;
pub mod guest_mem;
pub mod harness;
pub mod host;
pub mod irq;
pub mod mmio;
pub mod phys;
pub mod profile;
pub mod sched;
pub mod shadow_pt;
pub mod trace;
pub mod vgpu;
pub mod vram_alloc;

pub use gf100;
