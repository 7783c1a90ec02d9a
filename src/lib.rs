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
//! - [`phys`]: the `PhysicalGpu` trait (re-exported from the `gpuvm-phys` crate, with the
//!   address newtypes [`addr`], interrupt lines [`irq`] and time bases [`clock`]).
//!
//! This crate is the device-model core a VMM embeds. It depends on no guest driver, simulator,
//! trace, plotting, CLI or experiment code: the simulated GF100 is `gpuvm-sim`, the VFIO backend
//! `gpuvm-vfio`, traces and fault injection `gpuvm-trace`, the in-process harness and the
//! experiments `gpuvm-harness` (`docs/design.md` draws the crates and their layers).
#![deny(missing_docs)]

pub mod channels;
pub mod guest_mem;
pub mod host;
mod layout;
pub mod migrate;
pub mod mmio;
mod phys_driver;
pub mod profile;
pub mod sched;
pub mod shadow_pt;
pub mod stats;
pub mod vgpu;
pub mod vram_alloc;

pub use gf100;
pub use gpuvm_phys as phys;
pub use gpuvm_phys::{addr, clock, irq};
