//! gpuvm: full virtualization of an NVIDIA Fermi GF100 GPU (presented as a Quadro 6000) for
//! rust-vmm VMMs, in the style of GPUvm (Suzuki et al., USENIX ATC 2014).
//!
//! The crate layout follows the data flow of one guest access (see `docs/design.md`):
//! MMIO trap -> shadow page tables / shadow channels -> scheduler -> physical GPU.
//! Today the physical GPU layer ([`phys`]) with its simulated GF100 and the in-process
//! [`harness`] that runs the shared guest driver exist.
#![deny(missing_docs)]

pub mod addr;
pub mod clock;
pub mod guest_mem;
pub mod harness;
pub mod irq;
pub mod mmio;
pub mod phys;
pub mod profile;
pub mod shadow_pt;
pub mod vram_alloc;

pub use gf100;
