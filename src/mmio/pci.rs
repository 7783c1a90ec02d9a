//! The vGPU's PCI configuration space: a real Quadro 6000 (GF100) as `lspci -vvv` shows it.
//!
//! A plain struct in the style of rust-vmm/vm-superio devices and Cloud Hypervisor's
//! `PciConfiguration`: the VMM forwards config-space accesses to [`PciConfig::read`] /
//! [`PciConfig::write`] and asks it where the guest put the BARs ([`PciConfig::bar_address`]),
//! whether decoding is on ([`PciConfig::memory_enabled`]) and how MSI is programmed
//! ([`PciConfig::msi`]).
//!
//! The layout is data: [`LAYOUT`] lists every implemented register with its reset value and the
//! bits software may write; everything else is read-only zero. A write changes only writable
//! bits, which is also what makes BAR sizing work as on hardware (writing all-ones to a BAR reads
//! back its size mask, because the address bits below the size are read-only zero and the low type
//! bits are read-only). The expansion ROM BAR sizes the same way (512 KiB, as on the real card)
//! and decodes only while its enable bit and memory decoding are both on
//! ([`PciConfig::rom_enabled`]); what it decodes is the generated VBIOS (`crate::mmio::vbios`).
//! Three registers have side rules on top of the mask, as the specifications
//! require: MSI multiple-message-enable is clamped to what is advertised, the PM power state
//! discards writes of the unsupported D1/D2, and each BAR remembers whether it is being sized.
//!
//! Identity and BARs: [`gf100::pci`] (GXEN `nvc0_main.c`, the `lspci -vvv` of the GPUvm authors'
//! card: 10de:06d8 rev a3, subsystem 10de:076f; Region 0 32M 32-bit non-prefetchable, Region 1
//! 128M 64-bit prefetchable, Region 3 64M 64-bit prefetchable, Region 5 I/O 128 bytes;
//! Capabilities `[60] PM v3, [68] MSI 64bit, [78] Express (v1) Endpoint x16 2.5GT/s`). Capability
//! fields that listing does not show are marked MODEL below.

use gf100::pci as id;
use serde::{Deserialize, Serialize};

/// Size of the configuration space (PCI Express extended space included).
pub const CONFIG_SPACE_SIZE: usize = 4096;
/// Size of the conventional (PCI-compatible) part that is backed by registers.
const HEADER_SPACE: usize = 256;

// Header offsets (PCI Local Bus 3.0, type 0 header).
const VENDOR: u16 = 0x00;
const DEVICE: u16 = 0x02;
const COMMAND: u16 = 0x04;
const STATUS: u16 = 0x06;
const REVISION: u16 = 0x08;
const CLASS: u16 = 0x09;
const CACHE_LINE: u16 = 0x0c;
const HEADER_TYPE: u16 = 0x0e;
const BAR_BASE: u16 = 0x10;
const SUBSYS_VENDOR: u16 = 0x2c;
const SUBSYS_ID: u16 = 0x2e;
const ROM: u16 = 0x30;
const CAP_PTR: u16 = 0x34;
const INT_LINE: u16 = 0x3c;
const INT_PIN: u16 = 0x3d;

/// Command register: I/O space enable.
pub const CMD_IO: u16 = 1 << 0;
/// Command register: memory space enable.
pub const CMD_MEMORY: u16 = 1 << 1;
/// Command register: bus master enable.
pub const CMD_BUS_MASTER: u16 = 1 << 2;
/// Command register: parity error response.
pub const CMD_PARITY: u16 = 1 << 6;
/// Command register: SERR# enable.
pub const CMD_SERR: u16 = 1 << 8;
/// Command register: INTx emulation disable.
pub const CMD_INTX_DISABLE: u16 = 1 << 10;
/// The command bits this device implements; the others are read-only zero (a PCI Express
/// function hardwires special cycles, MWI, VGA palette snoop, IDSEL stepping and fast
/// back-to-back to 0).
const CMD_WRITABLE: u16 =
    CMD_IO | CMD_MEMORY | CMD_BUS_MASTER | CMD_PARITY | CMD_SERR | CMD_INTX_DISABLE;
/// Status register: a capabilities list is present.
const STATUS_CAP_LIST: u16 = 1 << 4;

// Power Management capability (PCI PM 1.2, "PM v3").
const PM: u16 = id::CAP_PM as u16;
const PM_PMC: u16 = PM + 2;
const PM_PMCSR: u16 = PM + 4;
/// PMCSR PowerState field.
const PM_STATE_MASK: u16 = 0x3;
/// PMCSR No_Soft_Reset. MODEL: the device model keeps all its state across D3hot -> D0, so it
/// says so (software then need not restore config space after the transition).
const PM_NO_SOFT_RESET: u16 = 1 << 3;

// MSI capability, 64-bit address, no per-vector masking (layout: control +2, address lo +4,
// address hi +8, data +0xc).
const MSI: u16 = id::CAP_MSI as u16;
const MSI_CTRL: u16 = MSI + 2;
const MSI_ADDR_LO: u16 = MSI + 4;
const MSI_ADDR_HI: u16 = MSI + 8;
const MSI_DATA: u16 = MSI + 0xc;
const MSI_CTRL_ENABLE: u16 = 1 << 0;
/// Multiple Message Capable (bits 3:1) = 0: one vector.
const MSI_MMC: u16 = 0;
const MSI_MME_SHIFT: u16 = 4;
const MSI_MME_MASK: u16 = 0x7 << MSI_MME_SHIFT;
const MSI_CTRL_64BIT: u16 = 1 << 7;

// PCI Express capability, version 1 (PCIe 1.0a layout).
const PCIE: u16 = id::CAP_PCIE as u16;
const PCIE_CAPS: u16 = PCIE + 2;
const PCIE_DEVCAP: u16 = PCIE + 4;
const PCIE_DEVCTL: u16 = PCIE + 8;
const PCIE_LINKCAP: u16 = PCIE + 0xc;
const PCIE_LINKCTL: u16 = PCIE + 0x10;
const PCIE_LINKSTA: u16 = PCIE + 0x12;
/// Capability version 1, device/port type 0 (PCI Express Endpoint).
const PCIE_CAPS_V1_ENDPOINT: u32 = 0x0001;
/// MODEL: Max_Payload_Size supported 128 bytes (0), L0s/L1 acceptable latency "no limit" (7/7),
/// extended tag field supported (bit 5), role-based error reporting (bit 15).
const PCIE_DEVCAP_VALUE: u32 = (1 << 15) | (7 << 9) | (7 << 6) | (1 << 5);
/// Device control: error reporting enables (3:0), relaxed ordering (4), max payload (7:5),
/// extended tag (8), no snoop (11), max read request (14:12). Phantom functions, aux power and
/// function-level reset are not implemented (read-only 0).
const PCIE_DEVCTL_WRITABLE: u32 = 0x000f | 0x0010 | 0x00e0 | 0x0100 | 0x0800 | 0x7000;
/// Reset value required by the specification: relaxed ordering and no snoop enabled, max read
/// request 512 bytes, max payload 128 bytes.
const PCIE_DEVCTL_RESET: u32 = 0x0010 | 0x0800 | 0x2000;
/// Link: 2.5 GT/s (speed code 1), x16. MODEL: no ASPM support advertised, port number 0.
const PCIE_LINK_SPEED_2_5GT: u32 = 1;
const PCIE_LINK_WIDTH_X16: u32 = 16 << 4;
/// Link control: read completion boundary (3), common clock (6), extended synch (7). ASPM control
/// is read-only 0 since no ASPM is advertised.
const PCIE_LINKCTL_WRITABLE: u32 = 0x0008 | 0x0040 | 0x0080;
/// Link status: current speed and negotiated width as above, slot clock configuration (12).
const PCIE_LINKSTA_VALUE: u32 = PCIE_LINK_SPEED_2_5GT | PCIE_LINK_WIDTH_X16 | (1 << 12);

/// Memory BAR type bits: 64-bit (bits 2:1 = 10b).
const BAR_MEM_64: u32 = 0b100;
/// Memory BAR type bits: prefetchable.
const BAR_PREFETCH: u32 = 0b1000;
/// I/O BAR indicator bit.
const BAR_IO: u32 = 0b1;
/// Expansion ROM BAR: address decode enable (PCI Local Bus 3.0 §6.2.5.2).
pub const ROM_ENABLE: u32 = 1;
/// Expansion ROM BAR: writable address bits for a ROM of [`id::ROM_SIZE`] bytes (bits 31:11
/// hold the address; 10:1 are reserved, read-only zero).
const ROM_ADDR_MASK: u32 = (!(id::ROM_SIZE - 1)) as u32 & 0xffff_f800;

/// Writable bits of the low dword of a memory BAR of `size` bytes (a power of two).
const fn mem_bar_lo_mask(size: u64) -> u32 {
    (!(size - 1)) as u32 & !0xf
}

/// Writable bits of the high dword of a 64-bit memory BAR of `size` bytes.
const fn mem_bar_hi_mask(size: u64) -> u32 {
    ((!(size - 1)) >> 32) as u32
}

/// Writable bits of an I/O BAR of `size` bytes.
const fn io_bar_mask(size: u64) -> u32 {
    (!(size - 1)) as u32 & !0x3
}

/// One implemented register: its offset, width in bytes, reset value and the bits software may
/// write. Bytes not covered by any entry are read-only zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigReg {
    /// Offset in configuration space.
    pub offset: u16,
    /// Width in bytes (1, 2 or 4).
    pub width: u8,
    /// Value after reset.
    pub reset: u32,
    /// Bits software may change.
    pub writable: u32,
    /// Name (PCI / PCI Express specification names).
    pub name: &'static str,
}

const fn r(offset: u16, width: u8, reset: u32, writable: u32, name: &'static str) -> ConfigReg {
    ConfigReg {
        offset,
        width,
        reset,
        writable,
        name,
    }
}

/// The configuration space of a Quadro 6000, register by register.
pub static LAYOUT: &[ConfigReg] = &[
    r(VENDOR, 2, id::VENDOR_ID as u32, 0, "Vendor ID"),
    r(DEVICE, 2, id::DEVICE_ID as u32, 0, "Device ID"),
    r(COMMAND, 2, 0, CMD_WRITABLE as u32, "Command"),
    r(STATUS, 2, STATUS_CAP_LIST as u32, 0, "Status"),
    r(REVISION, 1, id::REVISION as u32, 0, "Revision ID"),
    // Class code is 3 bytes: prog-if (0x09), subclass (0x0a), base class (0x0b).
    r(CLASS, 1, id::CLASS_CODE & 0xff, 0, "Programming Interface"),
    r(
        CLASS + 1,
        2,
        id::CLASS_CODE >> 8,
        0,
        "Sub-class / Base class",
    ),
    // PCI Express functions implement Cache Line Size as read/write with no effect; Latency
    // Timer is hardwired to 0.
    r(CACHE_LINE, 1, 0, 0xff, "Cache Line Size"),
    // Header type 0; not multi-function (the model does not present the card's HDA function).
    r(HEADER_TYPE, 1, 0, 0, "Header Type"),
    r(
        BAR_BASE,
        4,
        0,
        mem_bar_lo_mask(id::BAR0_SIZE),
        "BAR0 (32-bit memory, 32 MiB)",
    ),
    r(
        BAR_BASE + 4,
        4,
        BAR_MEM_64 | BAR_PREFETCH,
        mem_bar_lo_mask(id::BAR1_SIZE),
        "BAR1 low (64-bit prefetchable memory, 128 MiB)",
    ),
    r(
        BAR_BASE + 8,
        4,
        0,
        mem_bar_hi_mask(id::BAR1_SIZE),
        "BAR1 high",
    ),
    r(
        BAR_BASE + 12,
        4,
        BAR_MEM_64 | BAR_PREFETCH,
        mem_bar_lo_mask(id::BAR3_SIZE),
        "BAR3 low (64-bit prefetchable memory, 64 MiB)",
    ),
    r(
        BAR_BASE + 16,
        4,
        0,
        mem_bar_hi_mask(id::BAR3_SIZE),
        "BAR3 high",
    ),
    r(
        BAR_BASE + 20,
        4,
        BAR_IO,
        io_bar_mask(id::BAR5_SIZE),
        "BAR5 (I/O, 128 bytes)",
    ),
    r(
        SUBSYS_VENDOR,
        2,
        id::SUBSYSTEM_VENDOR_ID as u32,
        0,
        "Subsystem Vendor ID",
    ),
    r(SUBSYS_ID, 2, id::SUBSYSTEM_ID as u32, 0, "Subsystem ID"),
    // Expansion ROM: 512 KiB as on the real card. It decodes the VBIOS the project generates
    // from documented structures (`crate::mmio::vbios`), not NVIDIA's image.
    r(
        ROM,
        4,
        0,
        ROM_ADDR_MASK | ROM_ENABLE,
        "Expansion ROM Base Address (512 KiB)",
    ),
    r(CAP_PTR, 1, id::CAP_PM as u32, 0, "Capabilities Pointer"),
    r(INT_LINE, 1, 0, 0xff, "Interrupt Line"),
    r(INT_PIN, 1, 1, 0, "Interrupt Pin (INTA#)"),
    // Power Management.
    r(PM, 1, 0x01, 0, "PM: Capability ID"),
    r(PM + 1, 1, id::CAP_MSI as u32, 0, "PM: Next"),
    // Version 3 (PCI PM 1.2); no PME, no D1/D2, no aux current.
    r(PM_PMC, 2, 0x0003, 0, "PM: Capabilities"),
    r(
        PM_PMCSR,
        2,
        PM_NO_SOFT_RESET as u32,
        PM_STATE_MASK as u32,
        "PM: Control/Status",
    ),
    // MSI.
    r(MSI, 1, 0x05, 0, "MSI: Capability ID"),
    r(MSI + 1, 1, id::CAP_PCIE as u32, 0, "MSI: Next"),
    r(
        MSI_CTRL,
        2,
        (MSI_CTRL_64BIT | MSI_MMC) as u32,
        (MSI_CTRL_ENABLE | MSI_MME_MASK) as u32,
        "MSI: Message Control",
    ),
    r(MSI_ADDR_LO, 4, 0, 0xffff_fffc, "MSI: Message Address"),
    r(MSI_ADDR_HI, 4, 0, 0xffff_ffff, "MSI: Message Upper Address"),
    r(MSI_DATA, 2, 0, 0xffff, "MSI: Message Data"),
    // PCI Express.
    r(PCIE, 1, 0x10, 0, "PCIe: Capability ID"),
    r(PCIE + 1, 1, 0x00, 0, "PCIe: Next (end of list)"),
    r(PCIE_CAPS, 2, PCIE_CAPS_V1_ENDPOINT, 0, "PCIe: Capabilities"),
    r(
        PCIE_DEVCAP,
        4,
        PCIE_DEVCAP_VALUE,
        0,
        "PCIe: Device Capabilities",
    ),
    r(
        PCIE_DEVCTL,
        2,
        PCIE_DEVCTL_RESET,
        PCIE_DEVCTL_WRITABLE,
        "PCIe: Device Control",
    ),
    r(
        PCIE_LINKCAP,
        4,
        PCIE_LINK_SPEED_2_5GT | PCIE_LINK_WIDTH_X16,
        0,
        "PCIe: Link Capabilities",
    ),
    r(
        PCIE_LINKCTL,
        2,
        0,
        PCIE_LINKCTL_WRITABLE,
        "PCIe: Link Control",
    ),
    r(PCIE_LINKSTA, 2, PCIE_LINKSTA_VALUE, 0, "PCIe: Link Status"),
];

/// How one BAR of the device is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarInfo {
    /// PCI BAR index (0, 1, 3 or 5).
    pub index: u8,
    /// Size in bytes.
    pub size: u64,
    /// 64-bit memory BAR (occupies slots `index` and `index + 1`).
    pub is_64bit: bool,
    /// I/O space rather than memory.
    pub is_io: bool,
    /// Prefetchable memory.
    pub prefetchable: bool,
}

/// The device's BARs, as on the real card.
pub const BARS: [BarInfo; 4] = [
    BarInfo {
        index: 0,
        size: id::BAR0_SIZE,
        is_64bit: false,
        is_io: false,
        prefetchable: false,
    },
    BarInfo {
        index: 1,
        size: id::BAR1_SIZE,
        is_64bit: true,
        is_io: false,
        prefetchable: true,
    },
    BarInfo {
        index: 3,
        size: id::BAR3_SIZE,
        is_64bit: true,
        is_io: false,
        prefetchable: true,
    },
    BarInfo {
        index: 5,
        size: id::BAR5_SIZE,
        is_64bit: false,
        is_io: true,
        prefetchable: false,
    },
];

/// The layout of BAR `bar`, `None` for the unused slots 2 and 4 (upper halves) and beyond.
pub fn bar_info(bar: u8) -> Option<BarInfo> {
    BARS.iter().copied().find(|b| b.index == bar)
}

/// The programmed MSI message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MsiState {
    /// MSI Enable.
    pub enabled: bool,
    /// Message address (64-bit; low 2 bits always 0).
    pub address: u64,
    /// Message data.
    pub data: u16,
    /// Multiple Message Enable: log2 of the vectors granted (always 0 = one vector here).
    pub multiple_message_enable: u8,
}

/// Device power state (PMCSR PowerState); D1 and D2 are not supported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PowerState {
    /// Fully on.
    D0,
    /// Powered down but still addressable through configuration space only.
    D3Hot,
}

/// The software-writable state of the configuration space: what a snapshot must keep. The
/// read-only identity is not part of it and is never taken from a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PciConfigState {
    /// Command register.
    pub command: u16,
    /// Cache Line Size.
    pub cache_line_size: u8,
    /// The dword software last wrote to each of the six BAR slots (masked on restore, so a
    /// snapshot taken in the middle of BAR sizing restores in the middle of sizing).
    pub bars: [u32; 6],
    /// Interrupt Line.
    pub interrupt_line: u8,
    /// PM Control/Status.
    pub pm_control: u16,
    /// MSI Message Control.
    pub msi_control: u16,
    /// MSI Message Address, low dword.
    pub msi_address_lo: u32,
    /// MSI Message Upper Address.
    pub msi_address_hi: u32,
    /// MSI Message Data.
    pub msi_data: u16,
    /// PCI Express Device Control.
    pub pcie_device_control: u16,
    /// PCI Express Link Control.
    pub pcie_link_control: u16,
    /// Expansion ROM Base Address (absent in snapshots older than the ROM BAR: 0, disabled).
    #[serde(default)]
    pub rom: u32,
}

/// The configuration space of one vGPU.
#[derive(Debug, Clone)]
pub struct PciConfig {
    /// The first 256 bytes (header and capabilities), as read.
    regs: [u8; HEADER_SPACE],
    /// Writable bits of each byte of `regs`.
    wmask: [u8; HEADER_SPACE],
    /// The dword software last wrote to each BAR slot, before masking; all-ones means the slot is
    /// being sized.
    bar_written: [u32; 6],
}

impl PciConfig {
    /// A Quadro 6000 after reset: BARs unprogrammed, decoding off, MSI off, D0.
    pub fn quadro6000() -> PciConfig {
        let mut regs = [0u8; HEADER_SPACE];
        let mut wmask = [0u8; HEADER_SPACE];
        for reg in LAYOUT {
            let o = usize::from(reg.offset);
            let w = usize::from(reg.width);
            regs[o..o + w].copy_from_slice(&reg.reset.to_le_bytes()[..w]);
            wmask[o..o + w].copy_from_slice(&reg.writable.to_le_bytes()[..w]);
        }
        PciConfig {
            regs,
            wmask,
            bar_written: [0; 6],
        }
    }

    /// Reads `data.len()` bytes at `offset`. Accesses must be 1, 2 or 4 bytes, naturally aligned
    /// and inside the 4 KiB configuration space; anything else reads all-ones (as a master abort
    /// would). The extended space (0x100..0x1000) reads 0: the extended-capability header at
    /// 0x100 is the empty one (ID 0, version 0, next 0), which PCI Express requires to say "no
    /// extended capabilities".
    pub fn read(&self, offset: u16, data: &mut [u8]) {
        let Some(o) = valid_access(offset, data.len()) else {
            data.fill(0xff);
            return;
        };
        if o >= HEADER_SPACE {
            data.fill(0);
        } else {
            data.copy_from_slice(&self.regs[o..o + data.len()]);
        }
    }

    /// Writes `data` at `offset`; read-only bits keep their value and invalid accesses (see
    /// [`PciConfig::read`]) are ignored.
    pub fn write(&mut self, offset: u16, data: &[u8]) {
        let Some(o) = valid_access(offset, data.len()) else {
            return;
        };
        if o >= HEADER_SPACE {
            return;
        }
        let old_power = self.reg16(PM_PMCSR);
        for (i, &b) in data.iter().enumerate() {
            let m = self.wmask[o + i];
            self.regs[o + i] = (self.regs[o + i] & !m) | (b & m);
            // BAR slots: remember the unmasked value software wrote.
            let bar_base = usize::from(BAR_BASE);
            if (bar_base..bar_base + 24).contains(&(o + i)) {
                let slot = (o + i - bar_base) / 4;
                let shift = 8 * ((o + i - bar_base) % 4);
                let w = &mut self.bar_written[slot];
                *w = (*w & !(0xff << shift)) | (u32::from(b) << shift);
            }
        }
        // MSI: Multiple Message Enable may not exceed Multiple Message Capable.
        let ctrl = self.reg16(MSI_CTRL);
        let mmc = (MSI_MMC >> 1) & 0x7;
        let mme = (ctrl & MSI_MME_MASK) >> MSI_MME_SHIFT;
        if mme > mmc {
            self.set_reg16(MSI_CTRL, (ctrl & !MSI_MME_MASK) | (mmc << MSI_MME_SHIFT));
        }
        // PM: a write of an unsupported power state (D1, D2) completes but changes nothing.
        let pmcsr = self.reg16(PM_PMCSR);
        if matches!(pmcsr & PM_STATE_MASK, 1 | 2) {
            self.set_reg16(
                PM_PMCSR,
                (pmcsr & !PM_STATE_MASK) | (old_power & PM_STATE_MASK),
            );
        }
    }

    /// Base address the guest programmed into BAR `bar` (0, 1, 3 or 5); `None` for other
    /// indices, while the BAR is unprogrammed (0) or while any of its slots is being sized (holds
    /// the all-ones sizing pattern). Whether the device decodes it also depends on the command
    /// register ([`PciConfig::memory_enabled`], [`PciConfig::io_enabled`]).
    pub fn bar_address(&self, bar: u8) -> Option<u64> {
        let info = bar_info(bar)?;
        let slot = usize::from(bar);
        let slots = if info.is_64bit {
            slot..slot + 2
        } else {
            slot..slot + 1
        };
        if self.bar_written[slots].contains(&u32::MAX) {
            return None;
        }
        let lo_off = BAR_BASE + 4 * u16::from(bar);
        let type_bits = if info.is_io { 0x3 } else { 0xf };
        let mut addr = u64::from(self.reg32(lo_off) & !type_bits);
        if info.is_64bit {
            addr |= u64::from(self.reg32(lo_off + 4)) << 32;
        }
        (addr != 0).then_some(addr)
    }

    /// Address the guest programmed into the expansion ROM BAR (`None` while 0 or being sized),
    /// whether or not it is enabled.
    pub fn rom_address(&self) -> Option<u64> {
        let v = self.reg32(ROM) & ROM_ADDR_MASK;
        (v != 0 && v != ROM_ADDR_MASK).then_some(u64::from(v))
    }

    /// The device decodes its expansion ROM: the ROM BAR's enable bit and memory decoding both
    /// on (PCI Local Bus 3.0 §6.2.5.2).
    pub fn rom_enabled(&self) -> bool {
        self.reg32(ROM) & ROM_ENABLE != 0 && self.memory_enabled()
    }

    /// A Quadro 6000 as platform firmware hands over a boot GPU it has POSTed: memory
    /// decoding and bus mastering on, everything else at its reset value (BARs unassigned).
    /// An in-process VMM that addresses BARs by offset needs nothing more; a guest kernel that
    /// enumerates the device turns decoding off and on again as it sizes the BARs.
    pub fn firmware_enabled() -> PciConfig {
        let mut c = PciConfig::quadro6000();
        c.write(COMMAND, &(CMD_MEMORY | CMD_BUS_MASTER).to_le_bytes());
        c
    }

    /// The command register.
    pub fn command(&self) -> u16 {
        self.reg16(COMMAND)
    }

    /// The device decodes its memory BARs: command bit 1 set and the device in D0 (in D3hot a
    /// function answers configuration accesses only).
    pub fn memory_enabled(&self) -> bool {
        self.command() & CMD_MEMORY != 0 && self.power_state() == PowerState::D0
    }

    /// The device decodes its I/O BAR: command bit 0 set and the device in D0.
    pub fn io_enabled(&self) -> bool {
        self.command() & CMD_IO != 0 && self.power_state() == PowerState::D0
    }

    /// The device may master DMA (and so send MSI): command bit 2 set and the device in D0.
    pub fn bus_master(&self) -> bool {
        self.command() & CMD_BUS_MASTER != 0 && self.power_state() == PowerState::D0
    }

    /// INTx emulation is disabled (command bit 10): the legacy interrupt must not be asserted.
    pub fn intx_disabled(&self) -> bool {
        self.command() & CMD_INTX_DISABLE != 0
    }

    /// The programmed MSI message.
    pub fn msi(&self) -> MsiState {
        let ctrl = self.reg16(MSI_CTRL);
        MsiState {
            enabled: ctrl & MSI_CTRL_ENABLE != 0,
            address: u64::from(self.reg32(MSI_ADDR_LO)) | u64::from(self.reg32(MSI_ADDR_HI)) << 32,
            data: self.reg16(MSI_DATA),
            multiple_message_enable: ((ctrl & MSI_MME_MASK) >> MSI_MME_SHIFT) as u8,
        }
    }

    /// Interrupt Line (written by firmware/OS, no effect on the device).
    pub fn interrupt_line(&self) -> u8 {
        self.regs[usize::from(INT_LINE)]
    }

    /// The PM power state.
    pub fn power_state(&self) -> PowerState {
        match self.reg16(PM_PMCSR) & PM_STATE_MASK {
            0 => PowerState::D0,
            _ => PowerState::D3Hot,
        }
    }

    /// Snapshot of the writable state.
    pub fn state(&self) -> PciConfigState {
        PciConfigState {
            command: self.command(),
            cache_line_size: self.regs[usize::from(CACHE_LINE)],
            bars: self.bar_written,
            interrupt_line: self.interrupt_line(),
            pm_control: self.reg16(PM_PMCSR),
            msi_control: self.reg16(MSI_CTRL),
            msi_address_lo: self.reg32(MSI_ADDR_LO),
            msi_address_hi: self.reg32(MSI_ADDR_HI),
            msi_data: self.reg16(MSI_DATA),
            pcie_device_control: self.reg16(PCIE_DEVCTL),
            pcie_link_control: self.reg16(PCIE_LINKCTL),
            rom: self.reg32(ROM),
        }
    }

    /// A Quadro 6000 with the snapshot's state, written through the same masks as guest writes
    /// (a corrupt snapshot cannot change read-only bits).
    pub fn from_state(state: PciConfigState) -> PciConfig {
        let mut c = PciConfig::quadro6000();
        c.write(COMMAND, &state.command.to_le_bytes());
        c.write(CACHE_LINE, &[state.cache_line_size]);
        for (slot, v) in (0u16..).zip(state.bars) {
            c.write(BAR_BASE + 4 * slot, &v.to_le_bytes());
        }
        c.write(INT_LINE, &[state.interrupt_line]);
        c.write(PM_PMCSR, &state.pm_control.to_le_bytes());
        c.write(MSI_CTRL, &state.msi_control.to_le_bytes());
        c.write(MSI_ADDR_LO, &state.msi_address_lo.to_le_bytes());
        c.write(MSI_ADDR_HI, &state.msi_address_hi.to_le_bytes());
        c.write(MSI_DATA, &state.msi_data.to_le_bytes());
        c.write(PCIE_DEVCTL, &state.pcie_device_control.to_le_bytes());
        c.write(PCIE_LINKCTL, &state.pcie_link_control.to_le_bytes());
        c.write(ROM, &state.rom.to_le_bytes());
        c
    }

    fn reg16(&self, off: u16) -> u16 {
        let o = usize::from(off);
        u16::from_le_bytes([self.regs[o], self.regs[o + 1]])
    }

    fn set_reg16(&mut self, off: u16, v: u16) {
        let o = usize::from(off);
        self.regs[o..o + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn reg32(&self, off: u16) -> u32 {
        let o = usize::from(off);
        u32::from_le_bytes([
            self.regs[o],
            self.regs[o + 1],
            self.regs[o + 2],
            self.regs[o + 3],
        ])
    }
}

impl Default for PciConfig {
    fn default() -> Self {
        PciConfig::quadro6000()
    }
}

/// The offset as an index if an access of `len` bytes at `offset` is valid: 1, 2 or 4 bytes,
/// naturally aligned, inside configuration space.
fn valid_access(offset: u16, len: usize) -> Option<usize> {
    let o = usize::from(offset);
    (matches!(len, 1 | 2 | 4) && o % len == 0 && o + len <= CONFIG_SPACE_SIZE).then_some(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rd(c: &PciConfig, off: u16, len: usize) -> u32 {
        let mut b = [0u8; 4];
        c.read(off, &mut b[..len]);
        u32::from_le_bytes(b)
    }

    fn r32(c: &PciConfig, off: u16) -> u32 {
        rd(c, off, 4)
    }

    fn r16(c: &PciConfig, off: u16) -> u16 {
        rd(c, off, 2) as u16
    }

    fn r8(c: &PciConfig, off: u16) -> u8 {
        rd(c, off, 1) as u8
    }

    fn w32(c: &mut PciConfig, off: u16, v: u32) {
        c.write(off, &v.to_le_bytes());
    }

    fn w16(c: &mut PciConfig, off: u16, v: u16) {
        c.write(off, &v.to_le_bytes());
    }

    /// The bytes that make up the device's identity and structure (everything read-only that
    /// software uses to find and size the device).
    fn identity(c: &PciConfig) -> Vec<u32> {
        let mut v = vec![
            r32(c, 0x00),
            u32::from(r16(c, STATUS)),
            r32(c, 0x08),
            u32::from(r8(c, HEADER_TYPE)),
            r32(c, SUBSYS_VENDOR),
            r32(c, ROM) & !(ROM_ADDR_MASK | ROM_ENABLE),
            u32::from(r8(c, CAP_PTR)),
            u32::from(r8(c, INT_PIN)),
            r32(c, PM),
            r16(c, MSI) as u32,
            r32(c, PCIE),
            r32(c, PCIE_DEVCAP),
            r32(c, PCIE_LINKCAP),
            u32::from(r16(c, PCIE_LINKSTA)),
            u32::from(r16(c, MSI_CTRL) & 0xff8e),
        ];
        // BAR type bits.
        for slot in [0u16, 1, 3, 5] {
            let t = if slot == 5 { 0x3 } else { 0xf };
            v.push(r32(c, BAR_BASE + 4 * slot) & t);
        }
        v
    }

    #[test]
    fn identity_is_a_quadro_6000() {
        let c = PciConfig::quadro6000();
        assert_eq!(r16(&c, 0x00), 0x10de);
        assert_eq!(r16(&c, 0x02), 0x06d8);
        assert_eq!(r32(&c, 0x00), 0x06d8_10de);
        assert_eq!(r8(&c, 0x08), 0xa3);
        assert_eq!(r32(&c, 0x08), 0x0300_00a3, "class 03/00/00, rev a3");
        assert_eq!(r8(&c, 0x0e), 0, "header type 0, single function");
        assert_eq!(r16(&c, 0x2c), 0x10de);
        assert_eq!(r16(&c, 0x2e), 0x076f);
        assert_eq!(r16(&c, STATUS), 0x0010, "capabilities list");
        assert_eq!(r8(&c, INT_PIN), 1, "INTA#");
        assert_eq!(r16(&c, COMMAND), 0);
        // Expansion ROM: unassigned and disabled after reset.
        assert_eq!(r32(&c, ROM), 0);
        assert!(!c.rom_enabled() && c.rom_address().is_none());
        // Extended space: empty header, zeros; beyond it, all-ones.
        assert_eq!(r32(&c, 0x100), 0);
        assert_eq!(r32(&c, 0xffc), 0);
        assert_eq!(r32(&c, 0x1000), 0xffff_ffff);
    }

    #[test]
    fn layout_is_aligned_in_bounds_and_non_overlapping() {
        let mut owner = [None::<&str>; HEADER_SPACE];
        for reg in LAYOUT {
            let (o, w) = (usize::from(reg.offset), usize::from(reg.width));
            assert!(matches!(w, 1 | 2 | 4) && o % w == 0, "{}", reg.name);
            assert!(o + w <= HEADER_SPACE, "{}", reg.name);
            if w < 4 {
                assert!(
                    reg.reset >> (8 * w) == 0 && reg.writable >> (8 * w) == 0,
                    "{}",
                    reg.name
                );
            }
            for (i, slot) in owner.iter_mut().enumerate().skip(o).take(w) {
                assert!(slot.is_none(), "{} overlaps {:?} at {i:#x}", reg.name, slot);
                *slot = Some(reg.name);
            }
        }
    }

    #[test]
    fn every_bar_sizes_as_on_hardware() {
        let mut c = PciConfig::quadro6000();
        // (slot, expected read-back after writing all-ones)
        let expect = [
            (0u16, 0xfe00_0000u32), // 32 MiB, 32-bit, non-prefetchable
            (1, 0xf800_0000 | 0xc), // 128 MiB, 64-bit, prefetchable
            (2, 0xffff_ffff),       // BAR1 upper half
            (3, 0xfc00_0000 | 0xc), // 64 MiB, 64-bit, prefetchable
            (4, 0xffff_ffff),       // BAR3 upper half
            (5, 0xffff_ff80 | 0x1), // 128 bytes of I/O
        ];
        for (slot, mask) in expect {
            let off = BAR_BASE + 4 * slot;
            let orig = r32(&c, off);
            w32(&mut c, off, 0xffff_ffff);
            assert_eq!(r32(&c, off), mask, "slot {slot}");
            w32(&mut c, off, orig);
            assert_eq!(r32(&c, off), orig, "slot {slot} restored");
        }
        // The size software computes, as Linux __pci_read_base does.
        for info in BARS {
            let off = BAR_BASE + 4 * u16::from(info.index);
            w32(&mut c, off, 0xffff_ffff);
            let lo = r32(&c, off);
            let mut mask = if info.is_io {
                u64::from(lo & !0x3) | 0xffff_ffff_0000_0000
            } else {
                u64::from(lo & !0xf) | 0xffff_ffff_0000_0000
            };
            if info.is_64bit {
                assert_eq!((lo >> 1) & 3, 2, "64-bit type");
                w32(&mut c, off + 4, 0xffff_ffff);
                mask = u64::from(lo & !0xf) | u64::from(r32(&c, off + 4)) << 32;
                w32(&mut c, off + 4, 0);
            }
            assert_eq!(lo & 1, u32::from(info.is_io), "bar {}", info.index);
            assert_eq!(lo & 8 != 0, info.prefetchable, "bar {}", info.index);
            assert_eq!((!mask).wrapping_add(1), info.size, "bar {}", info.index);
            w32(&mut c, off, 0);
        }
        // Unused slots 2 and 4 do not exist as BARs of their own.
        assert_eq!(c.bar_address(2), None);
        assert_eq!(c.bar_address(4), None);
        assert_eq!(c.bar_address(6), None);
    }

    #[test]
    fn bar_type_bits_are_read_only() {
        let mut c = PciConfig::quadro6000();
        w32(&mut c, 0x10, 0);
        w32(&mut c, 0x14, 0);
        w32(&mut c, 0x1c, 0x0000_0003);
        w32(&mut c, 0x24, 0);
        assert_eq!(r32(&c, 0x10), 0);
        assert_eq!(r32(&c, 0x14), 0xc);
        assert_eq!(r32(&c, 0x1c), 0xc);
        assert_eq!(r32(&c, 0x24), 0x1);
        // Byte-wide write of the low byte changes nothing (all of it is read-only).
        c.write(0x14, &[0x00]);
        assert_eq!(r32(&c, 0x14), 0xc);
    }

    #[test]
    fn programming_bars_and_reading_them_back() {
        let mut c = PciConfig::quadro6000();
        for bar in [0, 1, 3, 5] {
            assert_eq!(c.bar_address(bar), None, "unprogrammed");
        }
        w32(&mut c, 0x10, 0xd800_0000);
        w32(&mut c, 0x14, 0xc000_000c);
        w32(&mut c, 0x18, 0);
        w32(&mut c, 0x1c, 0x0000_0000);
        w32(&mut c, 0x20, 0x0000_0004); // BAR3 above 4 GiB
        w32(&mut c, 0x24, 0xec81);
        assert_eq!(c.bar_address(0), Some(0xd800_0000));
        assert_eq!(c.bar_address(1), Some(0xc000_0000));
        assert_eq!(c.bar_address(3), Some(0x4_0000_0000));
        assert_eq!(c.bar_address(5), Some(0xec80));
        assert_eq!(r32(&c, 0x14), 0xc000_000c);
        assert_eq!(r32(&c, 0x24), 0xec81);
        // Address bits below the size are read-only zero.
        w32(&mut c, 0x10, 0xd812_3450);
        assert_eq!(c.bar_address(0), Some(0xd800_0000));
        // A BAR at the very top of its range is an address, not sizing.
        w32(&mut c, 0x14, 0xf800_0000);
        w32(&mut c, 0x18, 0x1);
        assert_eq!(c.bar_address(1), Some(0x1_f800_0000));
        // While sizing (either half), the BAR has no address; restoring brings it back.
        w32(&mut c, 0x14, 0xffff_ffff);
        assert_eq!(c.bar_address(1), None);
        w32(&mut c, 0x14, 0xf800_0000);
        w32(&mut c, 0x18, 0xffff_ffff);
        assert_eq!(c.bar_address(1), None);
        w32(&mut c, 0x18, 0x1);
        assert_eq!(c.bar_address(1), Some(0x1_f800_0000));
        // Sizing through two 16-bit writes counts as sizing too.
        w16(&mut c, 0x10, 0xffff);
        w16(&mut c, 0x12, 0xffff);
        assert_eq!(r32(&c, 0x10), 0xfe00_0000);
        assert_eq!(c.bar_address(0), None);
    }

    #[test]
    fn expansion_rom_bar_sizes_to_512k_and_decodes_only_when_enabled() {
        let mut c = PciConfig::quadro6000();
        // Sizing as Linux `pci_read_bases` does for the ROM: all-ones except the enable bit.
        w32(&mut c, ROM, !ROM_ENABLE);
        let mask = r32(&c, ROM);
        assert_eq!(
            mask, 0xfff8_0000,
            "address bits 31:19, reserved 10:1 read 0"
        );
        assert_eq!(
            u64::from((!(mask & 0xffff_f800)).wrapping_add(1)),
            512 << 10
        );
        assert_eq!(c.rom_address(), None, "being sized");
        // Assigned but not enabled: no decoding.
        w32(&mut c, ROM, 0xdb00_0000);
        assert_eq!(c.rom_address(), Some(0xdb00_0000));
        assert!(!c.rom_enabled());
        // Low bits below 512 KiB are read-only zero.
        w32(&mut c, ROM, 0xdb01_2345 | ROM_ENABLE);
        assert_eq!(r32(&c, ROM), 0xdb00_0001);
        // Enabled, but memory decoding off: still no decoding (PCI 3.0 6.2.5.2).
        assert!(!c.rom_enabled());
        w16(&mut c, COMMAND, CMD_MEMORY);
        assert!(c.rom_enabled());
        // Clearing the enable bit stops it; the address stays.
        w32(&mut c, ROM, 0xdb00_0000);
        assert!(!c.rom_enabled());
        assert_eq!(c.rom_address(), Some(0xdb00_0000));
        // The snapshot keeps it.
        w32(&mut c, ROM, 0xdb00_0001);
        let d = PciConfig::from_state(c.state());
        assert!(d.rom_enabled());
        assert_eq!(d.rom_address(), Some(0xdb00_0000));
    }

    #[test]
    fn firmware_enabled_state_decodes_and_masters() {
        let c = PciConfig::firmware_enabled();
        assert!(c.memory_enabled() && c.bus_master());
        assert!(!c.io_enabled() && !c.rom_enabled());
        assert_eq!(identity(&c), identity(&PciConfig::quadro6000()));
    }

    #[test]
    fn command_register_keeps_only_implemented_bits() {
        let mut c = PciConfig::quadro6000();
        w16(&mut c, COMMAND, 0xffff);
        assert_eq!(r16(&c, COMMAND), 0x0547);
        assert!(c.memory_enabled() && c.io_enabled() && c.bus_master() && c.intx_disabled());
        w16(&mut c, COMMAND, CMD_MEMORY);
        assert!(c.memory_enabled() && !c.io_enabled() && !c.bus_master());
        // Writing the status register changes nothing (read-only), nor does a dword write at 0x04
        // touch it.
        w16(&mut c, STATUS, 0xffff);
        w32(&mut c, COMMAND, 0xffff_0006);
        assert_eq!(r32(&c, COMMAND), 0x0010_0006);
        // Byte writes to the high command byte.
        c.write(COMMAND + 1, &[0xff]);
        assert_eq!(r16(&c, COMMAND), 0x0506);
        // The interrupt line is read/write, the pin is not.
        c.write(INT_LINE, &[11]);
        c.write(INT_PIN, &[4]);
        assert_eq!(c.interrupt_line(), 11);
        assert_eq!(r16(&c, INT_LINE), 0x010b);
    }

    #[test]
    fn capability_chain_reaches_pm_msi_pcie_and_ends() {
        let c = PciConfig::quadro6000();
        let mut found = Vec::new();
        let mut ptr = r8(&c, CAP_PTR);
        while ptr != 0 {
            assert!(ptr >= 0x40 && ptr.is_multiple_of(4), "cap pointer {ptr:#x}");
            assert!(found.len() < 48, "loop in the capability list");
            let off = u16::from(ptr);
            found.push((ptr, r8(&c, off)));
            ptr = r8(&c, off + 1);
        }
        assert_eq!(found, [(0x60, 0x01), (0x68, 0x05), (0x78, 0x10)]);
        // PM v3, no D1/D2.
        assert_eq!(r16(&c, PM_PMC) & 0x7, 3);
        assert_eq!(r16(&c, PM_PMC) & 0x0600, 0);
        // MSI: 64-bit capable, one vector, disabled.
        let ctrl = r16(&c, MSI_CTRL);
        assert!(ctrl & 0x80 != 0 && ctrl & 0x0e == 0 && ctrl & 1 == 0);
        // PCIe v1 endpoint, x16 2.5 GT/s.
        assert_eq!(r16(&c, PCIE_CAPS) & 0xff, 0x01);
        assert_eq!(r32(&c, PCIE_LINKCAP) & 0x3ff, 0x101);
        assert_eq!(r16(&c, PCIE_LINKSTA) & 0x3ff, 0x101);
    }

    #[test]
    fn msi_programming() {
        let mut c = PciConfig::quadro6000();
        assert_eq!(c.msi(), MsiState::default());
        w32(&mut c, MSI_ADDR_LO, 0xfee0_1003);
        w32(&mut c, MSI_ADDR_HI, 0x0000_0001);
        w32(&mut c, MSI_DATA, 0xdead_4041); // 16-bit register; the upper half is read-only 0
        assert_eq!(r32(&c, MSI_ADDR_LO), 0xfee0_1000, "low 2 bits read 0");
        assert_eq!(r32(&c, MSI_DATA), 0x4041);
        // Enable with 8 messages requested: clamped to the one advertised.
        w16(&mut c, MSI_CTRL, 0x0031);
        assert_eq!(r16(&c, MSI_CTRL), 0x0081);
        assert_eq!(
            c.msi(),
            MsiState {
                enabled: true,
                address: 0x1_fee0_1000,
                data: 0x4041,
                multiple_message_enable: 0,
            }
        );
        // The 64-bit bit and MMC are read-only.
        w16(&mut c, MSI_CTRL, 0x0000);
        assert_eq!(r16(&c, MSI_CTRL), 0x0080);
        assert!(!c.msi().enabled);
        // A dword write covering ID/next/control only changes the control's writable bits.
        w32(&mut c, MSI, 0x0001_0000);
        assert_eq!(r32(&c, MSI), 0x0081_7805);
    }

    #[test]
    fn power_states_d0_and_d3hot_only() {
        let mut c = PciConfig::quadro6000();
        w16(&mut c, COMMAND, CMD_MEMORY | CMD_IO | CMD_BUS_MASTER);
        assert_eq!(c.power_state(), PowerState::D0);
        w16(&mut c, PM_PMCSR, 3);
        assert_eq!(c.power_state(), PowerState::D3Hot);
        assert_eq!(r16(&c, PM_PMCSR), 0x000b);
        assert!(!c.memory_enabled() && !c.io_enabled() && !c.bus_master());
        // D1/D2 are not supported: the write is discarded.
        w16(&mut c, PM_PMCSR, 1);
        assert_eq!(c.power_state(), PowerState::D3Hot);
        w16(&mut c, PM_PMCSR, 0);
        assert_eq!(c.power_state(), PowerState::D0);
        w16(&mut c, PM_PMCSR, 2);
        assert_eq!(c.power_state(), PowerState::D0);
        assert!(c.memory_enabled(), "No_Soft_Reset: state kept across D3hot");
    }

    #[test]
    fn bad_accesses_read_all_ones_and_write_nothing() {
        let mut c = PciConfig::quadro6000();
        let before = c.clone();
        let mut b3 = [0u8; 3];
        c.read(0, &mut b3);
        assert_eq!(b3, [0xff; 3]);
        let mut b8 = [0u8; 8];
        c.read(0, &mut b8);
        assert_eq!(b8, [0xff; 8]);
        let mut b2 = [0u8; 2];
        c.read(0x11, &mut b2);
        assert_eq!(b2, [0xff; 2]);
        c.read(u16::MAX, &mut b2[..1]);
        assert_eq!(b2[0], 0xff);
        c.read(0, &mut []);
        c.write(0x11, &[0xff, 0xff]);
        c.write(0x10, &[0xff; 8]);
        c.write(0x3c, &[1, 2, 3]);
        c.write(0x1000, &[0xff; 4]);
        c.write(0x200, &[0xff; 4]);
        c.write(0, &[]);
        assert_eq!(c.regs, before.regs);
        assert_eq!(c.bar_written, before.bar_written);
    }

    #[test]
    fn state_round_trip() {
        let mut c = PciConfig::quadro6000();
        w16(&mut c, COMMAND, 0x0407);
        c.write(CACHE_LINE, &[0x10]);
        w32(&mut c, 0x10, 0xd800_0000);
        w32(&mut c, 0x14, 0xc000_000c);
        w32(&mut c, 0x1c, 0xffff_ffff); // snapshot mid-sizing
        w32(&mut c, 0x24, 0xec81);
        c.write(INT_LINE, &[10]);
        w16(&mut c, PM_PMCSR, 3);
        w32(&mut c, MSI_ADDR_LO, 0xfee0_0000);
        w32(&mut c, MSI_ADDR_HI, 0x2);
        w16(&mut c, MSI_DATA, 0x4022);
        w16(&mut c, MSI_CTRL, 1);
        w16(&mut c, PCIE_DEVCTL, 0x5020);
        w16(&mut c, PCIE_LINKCTL, 0x0040);
        let s = c.state();
        let text = toml::to_string(&s).expect("serialize");
        let s2: PciConfigState = toml::from_str(&text).expect("deserialize");
        assert_eq!(s, s2);
        let d = PciConfig::from_state(s2);
        assert_eq!(d.regs, c.regs);
        assert_eq!(d.bar_written, c.bar_written);
        assert_eq!(d.bar_address(3), None);
        assert_eq!(d.bar_address(0), Some(0xd800_0000));
        assert_eq!(d.msi(), c.msi());
        // A snapshot cannot change read-only bits.
        let bad = PciConfigState {
            command: 0xffff,
            msi_control: 0xffff,
            pm_control: 0xffff,
            ..PciConfigState::default()
        };
        let e = PciConfig::from_state(bad);
        assert_eq!(identity(&e), identity(&PciConfig::quadro6000()));
        assert_eq!(e.command(), 0x0547);
    }

    proptest! {
        #[test]
        fn random_accesses_never_panic_nor_change_identity(
            ops in proptest::collection::vec(
                (any::<u16>(), 0usize..=8, any::<[u8; 8]>(), any::<bool>(), any::<bool>()),
                1..200,
            )
        ) {
            let mut c = PciConfig::quadro6000();
            let id0 = identity(&c);
            for (off, len, data, write, low) in ops {
                // Half the accesses land in the implemented header, to hit real registers.
                let off = if low { off % 0x100 } else { off };
                if write {
                    c.write(off, &data[..len]);
                } else {
                    let mut buf = [0u8; 8];
                    c.read(off, &mut buf[..len]);
                }
            }
            prop_assert_eq!(identity(&c), id0);
            prop_assert!(c.msi().multiple_message_enable == 0);
            prop_assert!(c.msi().address & 3 == 0);
            // Whatever the state, a snapshot restores it exactly.
            let d = PciConfig::from_state(c.state());
            prop_assert_eq!(d.regs, c.regs);
            prop_assert_eq!(d.bar_written, c.bar_written);
        }
    }
}
