//! The guest-facing register state of a vGPU: PCI configuration space ([`pci`]), the BAR0
//! region table with its trap policy ([`regions`]), and the register files a VM's BAR0 answers
//! from — `vregs` (PMC, PFIFO, PFB, PTIMER, PV; with the virtual fault and PBDMA registers),
//! `vboard` (board-level registers nouveau probes, with the `vpmu`, `vpgraph` and `vce` stand-ins) and
//! the generated VBIOS ([`vbios`]). Plain state and its rules; the dispatch that uses them is
//! `crate::vgpu`.

pub mod pci;
pub mod regions;
pub mod vbios;
mod vboard;
pub(crate) mod vce;
pub(crate) mod vpgraph;
mod vpmu;
pub(crate) mod vregs;
