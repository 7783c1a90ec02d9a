//! Physical memory as the GF100's memory interface sees it: an address plus a target
//! (`g80_mem_target`: VRAM, or coherent / non-coherent system memory reached by DMA).
//!
//! Every physical access of the simulated GPU (page-table walks, instance blocks, USERD, engine
//! data, the PRAMIN window) goes through [`Memory`]. An access that reaches no memory (VRAM beyond
//! its end, system memory outside every DMA window) reads as all-ones, drops writes, and is
//! counted in `GpuStats::dma_errors`. Data accesses are also tallied per target so the cost model
//! can charge VRAM bandwidth or PCIe bandwidth.

use gf100::Target;

use super::dma::DmaWindows;
use super::vram::Vram;

/// Bytes moved per memory kind since the last [`Memory::take_traffic`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Traffic {
    /// Bytes read or written in VRAM.
    pub vram: u64,
    /// Bytes read or written in system memory.
    pub sys: u64,
}

/// VRAM plus the DMA windows, with error and traffic counters.
#[derive(Debug)]
pub(crate) struct Memory {
    /// Shared with the `SimGpu`, which reads and writes it without the state's lock when the
    /// engine worker runs.
    pub vram: std::sync::Arc<Vram>,
    pub dma: DmaWindows,
    /// Accesses that reached no memory.
    pub errors: u64,
    traffic: Traffic,
}

impl Memory {
    /// Memory with `vram_size` bytes of VRAM and no DMA windows.
    pub(crate) fn new(vram_size: u64) -> Memory {
        Memory {
            vram: std::sync::Arc::new(Vram::new(vram_size)),
            dma: DmaWindows::default(),
            errors: 0,
            traffic: Traffic::default(),
        }
    }

    /// Reads data (counted as traffic). Missing bytes read as 0xff; returns false on any miss.
    pub(crate) fn read(&mut self, target: Target, addr: u64, buf: &mut [u8]) -> bool {
        self.count(target, buf.len());
        self.read_raw(target, addr, buf)
    }

    /// Writes data (counted as traffic). Missing bytes are dropped; returns false on any miss.
    pub(crate) fn write(&mut self, target: Target, addr: u64, data: &[u8]) -> bool {
        self.count(target, data.len());
        let ok = match target {
            Target::Vram => self.vram.write(addr, data),
            Target::SysCoherent | Target::SysNonCoherent => self.dma.write(addr, data),
        };
        if !ok {
            self.errors += 1;
        }
        ok
    }

    /// Whether [`Memory::copy_direct`] can read (`write` false) or write `[addr, addr + len)`
    /// of `target` in place: VRAM within one written chunk (read) or one chunk (write), system
    /// memory within one DMA window. Where it cannot, the access would miss (an error) or read
    /// a VRAM chunk the simulator never wrote (through `pread`).
    pub(crate) fn in_place(&self, target: Target, addr: u64, len: usize, write: bool) -> bool {
        match (target, write) {
            (Target::Vram, false) => self.vram.read_slice(addr, len).is_some(),
            // Not `write_slice`: that would mark the chunk written before anything is.
            (Target::Vram, true) => self.vram.in_one_chunk(addr, len),
            (Target::SysCoherent | Target::SysNonCoherent, _) => {
                self.dma.slice(addr, len).is_some()
            }
        }
    }

    /// Copies `len` bytes from `src` to `dst` memory to memory, counted as the read and the
    /// write they are. Only for ranges [`Memory::in_place`] accepts, one of them in VRAM (two
    /// DMA windows may map the same guest RAM) and not overlapping; returns false, with
    /// nothing done, otherwise.
    pub(crate) fn copy_direct(
        &mut self,
        src: (Target, u64),
        dst: (Target, u64),
        len: usize,
    ) -> bool {
        let end = |a: u64| a.saturating_add(len as u64);
        let overlap = src.0 == dst.0 && src.1 < end(dst.1) && dst.1 < end(src.1);
        if (src.0.is_sysram() && dst.0.is_sysram()) || overlap {
            return false;
        }
        let from = match src.0 {
            Target::Vram => self.vram.read_slice(src.1, len),
            _ => self.dma.slice(src.1, len),
        };
        let Some(from) = from else {
            return false;
        };
        let to = match dst.0 {
            Target::Vram => self.vram.write_slice(dst.1, len),
            _ => self.dma.slice(dst.1, len),
        };
        let Some(to) = to else {
            return false;
        };
        from.copy_to_volatile_slice(to);
        self.count(src.0, len);
        self.count(dst.0, len);
        true
    }

    /// Counts `len` bytes of `target` as read, without reading them: what a staged copy read
    /// of a source that [`Memory::copy_direct`] did not need (its destination faulted).
    pub(crate) fn count_read(&mut self, target: Target, len: usize) {
        self.count(target, len);
    }

    /// Reads control structures (page tables, instance blocks, USERD, runlists): like
    /// [`Memory::read`] but not counted as data traffic.
    pub(crate) fn read_raw(&mut self, target: Target, addr: u64, buf: &mut [u8]) -> bool {
        let ok = match target {
            Target::Vram => {
                let ok = self.vram.read(addr, buf);
                if !ok {
                    let valid =
                        self.vram.size().saturating_sub(addr).min(buf.len() as u64) as usize;
                    buf[valid..].fill(0xff);
                }
                ok
            }
            Target::SysCoherent | Target::SysNonCoherent => self.dma.read(addr, buf),
        };
        if !ok {
            self.errors += 1;
        }
        ok
    }

    /// Reads a little-endian u32 control word; `None` if it reached no memory.
    pub(crate) fn read_u32(&mut self, target: Target, addr: u64) -> Option<u32> {
        let mut b = [0u8; 4];
        self.read_raw(target, addr, &mut b)
            .then_some(u32::from_le_bytes(b))
    }

    /// Reads a little-endian u64 control word; `None` if it reached no memory.
    pub(crate) fn read_u64(&mut self, target: Target, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.read_raw(target, addr, &mut b)
            .then_some(u64::from_le_bytes(b))
    }

    /// Writes a little-endian u32 control word (not counted as data traffic).
    pub(crate) fn write_u32(&mut self, target: Target, addr: u64, value: u32) -> bool {
        let before = self.traffic;
        let ok = self.write(target, addr, &value.to_le_bytes());
        self.traffic = before;
        ok
    }

    /// Returns and resets the data traffic tally (what an engine operation's launch-time scan
    /// predicts; compared in tests).
    #[cfg(test)]
    pub(crate) fn take_traffic(&mut self) -> Traffic {
        std::mem::take(&mut self.traffic)
    }

    fn count(&mut self, target: Target, len: usize) {
        match target {
            Target::Vram => self.traffic.vram += len as u64,
            Target::SysCoherent | Target::SysNonCoherent => self.traffic.sys += len as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misses_read_all_ones_and_are_counted() {
        let mut m = Memory::new(1 << 20);
        let mut b = [0u8; 4];
        assert!(!m.read(Target::Vram, (1 << 20) - 2, &mut b));
        assert_eq!(b, [0, 0, 0xff, 0xff]);
        assert!(!m.read(Target::SysCoherent, 0x1000, &mut b));
        assert_eq!(b, [0xff; 4]);
        assert!(!m.write(Target::SysNonCoherent, 0, &[1]));
        assert_eq!(m.errors, 3);
        assert_eq!(m.read_u32(Target::SysCoherent, 0), None);
        // Every byte of the buffer is written, hit or miss: the engines read into a reused
        // staging (`Core::stage`) and must never see what an earlier piece left there.
        for (target, addr) in [
            (Target::Vram, 0x100),
            (Target::Vram, (1 << 20) - 2),
            (Target::SysCoherent, 0x1000),
        ] {
            let mut b = [0xabu8; 64];
            m.read(target, addr, &mut b);
            assert!(!b.contains(&0xab), "{target:?} {addr:#x}: {b:?}");
        }
    }

    #[test]
    fn traffic_counts_data_but_not_control_words() {
        let mut m = Memory::new(1 << 20);
        assert!(m.write(Target::Vram, 0, &[0u8; 64]));
        assert!(m.write_u32(Target::Vram, 0x100, 7));
        assert_eq!(m.read_u32(Target::Vram, 0x100), Some(7));
        let mut b = [0u8; 16];
        assert!(m.read(Target::Vram, 0, &mut b));
        assert_eq!(m.take_traffic(), Traffic { vram: 80, sys: 0 });
        assert_eq!(m.take_traffic(), Traffic::default());
    }
}
