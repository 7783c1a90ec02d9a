//! MMIO exits in the vGPU's BAR windows, dispatched to `Vgpu::bar_read/bar_write` at the BAR
//! addresses the guest programmed through configuration space. Anything outside the decoded
//! windows is not the vGPU's: the caller stops the VM.

use gpuvm_guest::hal::Bar;

use super::device::VgpuDevice;
use super::pci::PciBus;

/// Command register: memory space enable.
const CMD_MEMORY: u32 = 1 << 1;

/// The vGPU's decoded memory BARs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BarWindows {
    windows: Vec<(Bar, u64, u64)>,
}

impl BarWindows {
    /// The windows as the vGPU's configuration space says now: none while memory decoding is
    /// off; a BAR at address 0 or one that would wrap is not decoded.
    pub fn from_config(pci: &PciBus) -> BarWindows {
        let command = pci.vgpu_dword(0x04) & 0xffff;
        if command & CMD_MEMORY == 0 {
            return BarWindows::default();
        }
        let mut windows = Vec::new();
        for bar in [Bar::Bar0, Bar::Bar1, Bar::Bar3] {
            let slot = 0x10 + 4 * bar.index() as u16;
            let lo = pci.vgpu_dword(slot);
            let mut base = (lo & !0xf) as u64;
            if (lo >> 1) & 3 == 2 {
                base |= (pci.vgpu_dword(slot + 4) as u64) << 32;
            }
            let size = bar.size();
            if base != 0 && base.checked_add(size).is_some() {
                windows.push((bar, base, size));
            }
        }
        BarWindows { windows }
    }

    /// The BAR and offset of an access of `len` bytes at `addr`, if it lies inside one window.
    pub fn lookup(&self, addr: u64, len: usize) -> Option<(Bar, u64)> {
        self.windows.iter().find_map(|&(bar, base, size)| {
            let off = addr.checked_sub(base)?;
            (off.checked_add(len as u64)? <= size).then_some((bar, off))
        })
    }

    /// The base address of `bar`'s window, if decoded.
    pub fn base(&self, bar: Bar) -> Option<u64> {
        self.windows
            .iter()
            .find_map(|&(b, base, _)| (b == bar).then_some(base))
    }

    /// The windows, for messages.
    pub fn describe(&self) -> String {
        if self.windows.is_empty() {
            return "none decoded".to_string();
        }
        self.windows
            .iter()
            .map(|(bar, base, size)| format!("BAR{} {base:#x}+{:#x}", bar.index(), size))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Dispatches an MMIO read; false if the address is outside every BAR.
    pub fn read(&self, vgpu: &dyn VgpuDevice, addr: u64, data: &mut [u8]) -> bool {
        match self.lookup(addr, data.len()) {
            Some((bar, off)) => {
                vgpu.bar_read(bar, off, data);
                true
            }
            None => false,
        }
    }

    /// Dispatches an MMIO write; false if the address is outside every BAR.
    pub fn write(&self, vgpu: &dyn VgpuDevice, addr: u64, data: &[u8]) -> bool {
        match self.lookup(addr, data.len()) {
            Some((bar, off)) => {
                vgpu.bar_write(bar, off, data);
                true
            }
            None => false,
        }
    }
}

/// BAR0's PRAMIN window (offset, size): writes there only store into VRAM.
const PRAMIN: (u64, u64) = (0x70_0000, 0x10_0000);

impl BarWindows {
    /// The ranges whose writes may be coalesced (queued by KVM in a ring without an exit, and
    /// replayed here, in order, before the next exit is handled): BAR3 (instance memory) and
    /// BAR0's PRAMIN window. Neither holds a doorbell or a register with a side effect the
    /// guest waits for without an exit of its own, so replaying them at the next exit changes
    /// no outcome. Reads in these ranges still exit.
    ///
    /// With BAR remap (`remap`) BAR3 is left out: its trapped pages are then mostly read-only
    /// slots (bound instance blocks, tracked page tables), whose reads do *not* exit, so a
    /// queued write would stay invisible to the guest's own read-back until some later exit
    /// (seen end to end: the `ro-write` guest read back the old word). Its writable pages are
    /// slots and never exit at all, so coalescing BAR3 saves nothing there.
    pub fn coalesce_zones(&self, remap: bool) -> Vec<(u64, u64)> {
        self.windows
            .iter()
            .filter_map(|&(bar, base, size)| match bar {
                Bar::Bar3 if remap => None,
                Bar::Bar3 => Some((base, size)),
                Bar::Bar0 => Some((base + PRAMIN.0, PRAMIN.1)),
                Bar::Bar1 => None,
            })
            .collect()
    }
}
