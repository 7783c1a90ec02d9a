//! Hardware facts about the NVIDIA Fermi GF100 (NVC0), as nouveau and envytools describe them.
//!
//! This crate holds *no state*: register offsets, bitfields, and codecs for the in-memory formats
//! (page-directory and page-table entries, instance blocks, GPFIFO entries, pushbuffer method
//! headers). It is shared by the device model (`gpuvm`), the simulated GF100 and the guest driver,
//! so that all three speak exactly the same interface.
//!
//! Every constant names its source. Short names used throughout:
//! - **ENVY**: envytools `rnndb/*.xml` and `docs/hw/*.rst` (commit f102b823).
//! - **NV-*: nouveau sources in Linux `drivers/gpu/drm/nouveau/nvkm/...` (see each module).
//! - **OGD**: NVIDIA `open-gpu-doc` class headers (`cl906f.h`, `cl90b5.h`, ...).
//! - **GXEN**: the GPUvm prototype (`CPFL/gxen`).
//! - **MODEL**: not hardware — a documented choice of this project (e.g. the compute kernels of the
//!   simulated GPU, since Fermi's shader ISA is out of scope).
//!
//! The full research notes are in the project's `shared/research/gf100-interface.md`; the register
//! map as implemented is in `docs/registers.md`.
#![no_std]
#![deny(missing_docs)]

pub mod board;
pub mod compute;
pub mod copy;
pub mod fault;
pub mod gpfifo;
pub mod host;
pub mod inst;
pub mod m2mf;
pub mod method;
pub mod mmu;
pub mod pbus;
pub mod pci;
pub mod pfb;
pub mod pffb;
pub mod pfifo;
pub mod pmc;
pub mod ptimer;
pub mod pv;
pub mod userd;
pub mod vbios;

/// Memory target ("aperture") of an address, in the encoding used by PTEs, instance pointers
/// (`g80_mem_target`), the PMEM window and the runlist base: 0 VRAM, 2 coherent (snooped) system
/// memory, 3 non-coherent system memory. (ENVY `rnndb/g80_defs.xml` `g80_mem_target`; NV-VMM
/// `gf100_vmm_aper`: VRAM 0, HOST 2, NCOH 3.)
///
/// Value 1: this crate (and the model) treats it as invalid everywhere. That is confirmed only for
/// channel instance pointers (ENVY `fifo/gf100_pfifo.xml` CHAN_TABLE_ERROR 6 INVALID_TARGET:
/// "write a channel instance with target == INVALID \[1\]"); `g80_defs.xml` itself only comments
/// "1 is some other sysram", and nouveau never writes 1. **(UNCERTAIN)** for PTEs and the other
/// registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// Video memory on the card.
    Vram,
    /// System memory, snooped (coherent) access.
    SysCoherent,
    /// System memory, non-snooped access.
    SysNonCoherent,
}

impl Target {
    /// Decodes the 2-bit `g80_mem_target` field; `None` for the invalid value 1.
    pub const fn from_bits(bits: u32) -> Option<Target> {
        match bits & 3 {
            0 => Some(Target::Vram),
            2 => Some(Target::SysCoherent),
            3 => Some(Target::SysNonCoherent),
            _ => None,
        }
    }

    /// The 2-bit `g80_mem_target` encoding.
    pub const fn bits(self) -> u32 {
        match self {
            Target::Vram => 0,
            Target::SysCoherent => 2,
            Target::SysNonCoherent => 3,
        }
    }

    /// True for either system-memory target.
    pub const fn is_sysram(self) -> bool {
        !matches!(self, Target::Vram)
    }
}

/// Size of a small page and of an instance block (4 KiB).
pub const PAGE_SIZE: u64 = 0x1000;
/// log2 of [`PAGE_SIZE`].
pub const PAGE_SHIFT: u32 = 12;

/// What a read of a register that does not exist returns (ENVY `docs/hw/mmio.rst`, "GF119 MMIO
/// errors": `0xbad001XX` = nonexistent register). Measured on GF119; assumed for GF100
/// (research notes, open question 8).
pub const BAD_REGISTER: u32 = 0xbad0_0100;
/// What a read of a unit disabled in `PMC.ENABLE` returns (ENVY `mmio.rst`, GF119: `0xbad0daXX`).
pub const BAD_DISABLED_UNIT: u32 = 0xbad0_da00;
/// What a BAR access that faults in the MMU returns (ENVY `mmio.rst`, GF119: `0xbad0acXX`).
pub const BAD_VM_FAULT: u32 = 0xbad0_ac00;
