//! A `no_std` GF100 guest driver and the Gdev-style workloads, shared by every place a guest
//! runs: in-process tests ("native" straight on the simulated GPU, or against a `Vgpu`), bare-metal
//! KVM guests, and later a Linux guest through sysfs `resource0`.
//!
//! The driver speaks the register protocol nouveau speaks for these parts (see `docs/design.md`)
//! and reaches the hardware only through the three small traits in [`hal`].
#![no_std]
#![deny(missing_docs)]

extern crate alloc;

pub mod hal;
