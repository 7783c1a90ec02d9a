//! VRAM access through the PRAMIN window: BAR0 0x700000..0x800000 shows 1 MiB of VRAM starting
//! at the address in PBUS PMEM (0x1700, in 64 KiB units). This is how the hypervisor reads and
//! writes its own structures (shadow page tables, shadow channel tables) and scrubs a VM's
//! slice on a real GF100, as nouveau's `nv50_instmem` slow path does.
//!
//! The window register is the backend's alone (guests' PRAMIN accesses are emulated by the vGPU
//! on top of [`gpuvm_phys::PhysicalGpu::read_vram`]): the current base is cached and PMEM is
//! written only when an access falls outside the window. The window is accessed in aligned
//! 32-bit words (BAR0 takes no other width); partial words at either end are read, merged and
//! written back.

use gf100::pbus;

use super::bars::BarIo;
use super::device::DeviceAccess;

/// The PRAMIN window's state.
#[derive(Debug, Default)]
pub(super) struct Pramin {
    /// The VRAM address the window shows now, if known.
    base: Option<u64>,
    /// PMEM writes done to move the window.
    pub(super) moves: u64,
}

/// The window's size as a `u64`.
const WINDOW: u64 = pbus::PRAMIN_SIZE as u64;

impl Pramin {
    /// Records a PMEM write made by someone else (a register write passed through).
    pub(super) fn pmem_written(&mut self, value: u32) {
        self.base = match pbus::pmem_decode(value) {
            Some((base, gf100::Target::Vram)) => Some(base),
            _ => None,
        };
    }

    /// The BAR0 offset of VRAM word `addr` (4-byte aligned), moving the window if needed.
    fn word_offset(&mut self, bar0: &BarIo, dev: &dyn DeviceAccess, addr: u64) -> u32 {
        let inside = self.base.filter(|&b| addr >= b && addr - b < WINDOW);
        let base = match inside {
            Some(b) => b,
            None => {
                let b = addr & !(WINDOW - 1);
                bar0.write32(dev, pbus::PMEM, pbus::pmem_encode(b, gf100::Target::Vram));
                self.base = Some(b);
                self.moves += 1;
                b
            }
        };
        pbus::PRAMIN_BASE + (addr - base) as u32
    }

    /// Reads `data.len()` bytes of VRAM at `addr` (the caller clips to the VRAM size).
    pub(super) fn read(
        &mut self,
        bar0: &BarIo,
        dev: &dyn DeviceAccess,
        addr: u64,
        data: &mut [u8],
    ) {
        let mut done = 0usize;
        while done < data.len() {
            let a = addr + done as u64;
            let word = a & !3;
            let skip = (a - word) as usize;
            let n = (4 - skip).min(data.len() - done);
            let off = self.word_offset(bar0, dev, word);
            let v = bar0.read32(dev, off).to_le_bytes();
            data[done..done + n].copy_from_slice(&v[skip..skip + n]);
            done += n;
        }
    }

    /// Writes `data` to VRAM at `addr` (the caller clips to the VRAM size).
    pub(super) fn write(&mut self, bar0: &BarIo, dev: &dyn DeviceAccess, addr: u64, data: &[u8]) {
        let mut done = 0usize;
        while done < data.len() {
            let a = addr + done as u64;
            let word = a & !3;
            let skip = (a - word) as usize;
            let n = (4 - skip).min(data.len() - done);
            let off = self.word_offset(bar0, dev, word);
            let mut v = if n == 4 {
                [0u8; 4]
            } else {
                bar0.read32(dev, off).to_le_bytes()
            };
            v[skip..skip + n].copy_from_slice(&data[done..done + n]);
            bar0.write32(dev, off, u32::from_le_bytes(v));
            done += n;
        }
    }

    /// Fills `len` bytes of VRAM at `addr` with `byte` (the caller clips to the VRAM size).
    pub(super) fn fill(
        &mut self,
        bar0: &BarIo,
        dev: &dyn DeviceAccess,
        addr: u64,
        len: u64,
        byte: u8,
    ) {
        let end = addr + len;
        let head = (addr.next_multiple_of(4)).min(end);
        self.write(bar0, dev, addr, &vec![byte; (head - addr) as usize]);
        let word = u32::from_ne_bytes([byte; 4]);
        let body_end = end & !3;
        let mut a = head;
        while a < body_end {
            let off = self.word_offset(bar0, dev, a);
            bar0.write32(dev, off, word);
            a += 4;
        }
        if body_end >= head && body_end < end {
            self.write(bar0, dev, body_end, &vec![byte; (end - body_end) as usize]);
        }
    }
}
