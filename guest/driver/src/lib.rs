//! A `no_std` GF100 guest driver and the Gdev-style workloads, shared by every place a guest
//! runs: in-process tests ("native" straight on the simulated GPU, or against a `Vgpu`), bare-metal
//! KVM guests, and later a Linux guest through sysfs `resource0`.
//!
//! The driver speaks the register protocol nouveau speaks for these parts (see `docs/design.md`)
//! and reaches the hardware only through the three small traits in [`hal`]. Module by module:
//!
//! | module | does | nouveau counterpart |
//! |---|---|---|
//! | [`device`] | BOOT_0 check, PMC, VRAM sizing, FB defaults, bring-up order | `nvkm_device_ctor`, `nv50_mc_init`, `gf100_fb_*` |
//! | [`pramin`] | PRAMIN window at 0x700000 | `instmem/nv50.c` slow path |
//! | [`instmem`] | instance memory through BAR3 (or PRAMIN), PFLUSH | `instmem/nv50.c` |
//! | [`bar`] | BAR3 and BAR1 VMs and bindings | `bar/gf100.c`, `bar/g84.c` |
//! | [`vram`], [`sysmem`] | VRAM and guest-RAM allocators | `nvkm_mm`, TTM pools |
//! | [`vm`] | channel address spaces, TLB invalidate | `mmu/vmmgf100.c` |
//! | [`pv`] | para-virtual page-table batches (vGPU only) | GPUvm `context_bar4.cc` multicall |
//! | [`buffer`] | GPU buffers in VRAM or guest RAM | `nouveau_bo` |
//! | [`fifo`] | PFIFO init, USERD, runlist | `engine/fifo/gf100.c` |
//! | [`channel`] | channels, submission | `gpfifogf100.c`, `nouveau_dma.c` |
//! | [`push`] | pushbuffer builder | `nouveau_dma.h`, `nvc0_fence.c`, `nvc0_bo_move_copy` |
//! | [`fence`] | fences, timestamps, waiting | `nvc0_fence.c`, `nouveau_fence.c` |
//! | [`intr`] | interrupts, MMU faults, PBDMA errors | `nvkm_mc_intr`, `gf100_fifo_intr` |
//! | [`workloads`] | Gdev microbenchmarks with CPU checks | Gdev `test/cuda/user` |
#![no_std]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

extern crate alloc;

pub mod config;
pub mod device;
pub mod error;
pub mod fence;
pub mod hal;
mod intr;
pub mod pramin;
pub mod push;
pub mod range;
pub mod reference;
pub mod sysmem;
pub mod vram;
pub mod wait;
pub mod workloads;

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod pv_tests;

pub use buffer::Buffer;
pub use channel::{Channel, Fence};
pub use config::{DriverConfig, FenceMode, InstAccess, MemLocation, Paravirt, ReleaseSize};
pub use device::Gpu;
// The device's parts keep their paths (`gpuvm_guest::channel::Channel`, ...).
pub use device::{bar, buffer, channel, fifo, instmem, pv, vm};
pub use error::DriverError;
pub use push::PushBuf;
pub use pv::PvStats;
pub use vm::{AddressSpace, Backing, PageSize};

/// Everything the driver needs from its platform, in one bound.
pub trait Hal: hal::Mmio + hal::Dma + hal::Platform {}
impl<T: hal::Mmio + hal::Dma + hal::Platform> Hal for T {}
