//! The guest-facing side of a vGPU: PCI configuration space, the BAR layout, and the BAR0 region
//! table with its trap policy.

pub mod pci;
pub mod regions;
pub mod vbios;
mod vboard;
pub(crate) mod vpgraph;
mod vpmu;
pub(crate) mod vregs;
