//! PCI identity and BAR layout of a real Quadro 6000 (GF100).
//!
//! Source: GXEN `tools/qemu-xen-traditional/hw/nvc0/nvc0_main.c` (the `lspci -vvv` of the GPUvm
//! authors' card) and `nvc0.h`; ENVY `docs/hw/pciid.rst` and `docs/hw/bus/bars.rst`.

/// NVIDIA's PCI vendor id.
pub const VENDOR_ID: u16 = 0x10de;
/// Quadro 6000 device id (ENVY `pciid.rst`: 0x06d8 Quadro 6000).
pub const DEVICE_ID: u16 = 0x06d8;
/// Revision of the GPUvm authors' card ("rev a3").
pub const REVISION: u8 = 0xa3;
/// Subsystem vendor id (NVIDIA).
pub const SUBSYSTEM_VENDOR_ID: u16 = 0x10de;
/// Subsystem device id ("Subsystem: NVIDIA Corporation Device 076f").
pub const SUBSYSTEM_ID: u16 = 0x076f;
/// Class code: display controller (0x03), VGA-compatible (0x00), prog-if 0.
pub const CLASS_CODE: u32 = 0x03_00_00;

/// BAR0: MMIO registers, 32-bit non-prefetchable, 32 MiB.
pub const BAR0_SIZE: u64 = 32 << 20;
/// BAR1: VRAM aperture through the BAR1 VM, 64-bit prefetchable, 128 MiB.
pub const BAR1_SIZE: u64 = 128 << 20;
/// BAR3 (nouveau "bar2"): instance-memory aperture through the BAR3 VM, 64-bit prefetchable, 64 MiB.
pub const BAR3_SIZE: u64 = 64 << 20;
/// BAR5: 128-byte I/O window (indirect register access).
pub const BAR5_SIZE: u64 = 0x80;
/// Expansion ROM BAR: 512 KiB ("Expansion ROM at db000000 [size=512K]" in the `lspci -vvv` of
/// the GPUvm authors' card, GXEN `nvc0_main.c`).
pub const ROM_SIZE: u64 = 512 << 10;
/// Capability offsets in config space: PM at 0x60, MSI (64-bit) at 0x68, PCI Express at 0x78.
pub const CAP_PM: u8 = 0x60;
/// MSI capability offset.
pub const CAP_MSI: u8 = 0x68;
/// PCI Express capability offset.
pub const CAP_PCIE: u8 = 0x78;

/// The BARs a GF100 driver touches, by PCI BAR index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bar {
    /// BAR0: registers.
    Bar0,
    /// BAR1: VRAM aperture through the BAR1 VM.
    Bar1,
    /// BAR3: instance-memory aperture through the BAR3 VM.
    Bar3,
}

impl Bar {
    /// Size of the BAR in bytes.
    pub const fn size(self) -> u64 {
        match self {
            Bar::Bar0 => BAR0_SIZE,
            Bar::Bar1 => BAR1_SIZE,
            Bar::Bar3 => BAR3_SIZE,
        }
    }

    /// PCI BAR index (0, 1 or 3).
    pub const fn index(self) -> u8 {
        match self {
            Bar::Bar0 => 0,
            Bar::Bar1 => 1,
            Bar::Bar3 => 3,
        }
    }
}

/// PPCI: PCI configuration space mirrored into BAR0 at `0x088000 + offset` (ENVY
/// `docs/hw/bus/pci.rst`; NV-`subdev/pci/base.c:nvkm_pci_rd32/wr32`, used for the ROM shadow
/// toggle `0x088050`, MSI, ASPM `0x088080`, link status `0x088088`).
pub const BAR0_MIRROR: u32 = 0x088000;
/// Size of the mirror (the 4 KiB extended configuration space).
pub const BAR0_MIRROR_SIZE: u32 = 0x1000;
