//! DMA windows: how the simulated GF100 reaches system memory. On real hardware the GPU issues
//! PCIe reads/writes at bus addresses that an IOMMU (VFIO) translates to host memory; here each
//! registered window maps an IOVA range onto a range of a VM's guest RAM (`GuestMemoryMmap`).
//!
//! An access that hits no window behaves like a PCIe master abort: reads return all-ones bytes,
//! writes are dropped, and the caller counts it (`GpuStats::dma_errors`).

use std::collections::BTreeMap;

use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryMmap, VolatileSlice};

use gpuvm_phys::addr::{Gpa, Iova};
use gpuvm_phys::DmaError;

/// One registered window.
#[derive(Debug)]
struct Window {
    len: u64,
    gpa: u64,
    mem: GuestMemoryMmap,
}

/// The registered DMA windows, keyed by their first IOVA.
#[derive(Debug, Default)]
pub(crate) struct DmaWindows {
    windows: BTreeMap<u64, Window>,
}

impl DmaWindows {
    /// Registers `[iova, iova + len)` -> guest RAM `[gpa, gpa + len)` of `mem`.
    pub(crate) fn map(
        &mut self,
        iova: Iova,
        len: u64,
        mem: GuestMemoryMmap,
        gpa: Gpa,
    ) -> Result<(), DmaError> {
        let end = DmaError::window_end(iova, len, gpa)?;
        let backed =
            usize::try_from(len).is_ok_and(|l| mem.check_range(GuestAddress(gpa.raw()), l));
        if !backed {
            return Err(DmaError::NotBacked { gpa, len });
        }
        let before = self.windows.range(..end).next_back();
        if before.is_some_and(|(&start, w)| start + w.len > iova.raw()) {
            return Err(DmaError::Overlap { iova });
        }
        self.windows.insert(
            iova.raw(),
            Window {
                len,
                gpa: gpa.raw(),
                mem,
            },
        );
        Ok(())
    }

    /// Removes the window starting at `iova`.
    pub(crate) fn unmap(&mut self, iova: Iova) -> Result<(), DmaError> {
        self.windows
            .remove(&iova.raw())
            .map(|_| ())
            .ok_or(DmaError::NoSuchWindow(iova))
    }

    /// The window containing `iova`, with the number of bytes left in it from there.
    fn lookup(&self, iova: u64) -> Option<(&Window, u64)> {
        let (&start, w) = self.windows.range(..=iova).next_back()?;
        let off = iova - start;
        (off < w.len).then_some((w, off))
    }

    /// Bytes (at least 1, at most `rest`) from `iova`, which no window contains, to the next
    /// window.
    fn gap_len(&self, iova: u64, rest: usize) -> usize {
        match self.windows.range(iova..).next() {
            Some((&next, _)) => rest
                .min(usize::try_from(next - iova).unwrap_or(usize::MAX))
                .max(1),
            None => rest,
        }
    }

    /// `[iova, iova + len)` in place, if one window holds all of it.
    pub(crate) fn slice(&self, iova: u64, len: usize) -> Option<VolatileSlice<'_>> {
        let (w, off) = self.lookup(iova)?;
        if (len as u64) > w.len - off {
            return None;
        }
        w.mem.get_slice(GuestAddress(w.gpa + off), len).ok()
    }

    /// Reads `buf.len()` bytes at `iova`. Bytes outside every window read as 0xff; returns false
    /// if any byte missed.
    pub(crate) fn read(&self, iova: u64, buf: &mut [u8]) -> bool {
        let mut ok = true;
        let mut done = 0usize;
        while done < buf.len() {
            let a = iova.saturating_add(done as u64);
            let rest = buf.len() - done;
            let Some((w, off)) = self.lookup(a) else {
                let n = self.gap_len(a, rest);
                buf[done..done + n].fill(0xff);
                ok = false;
                done += n;
                continue;
            };
            let n = rest.min(usize::try_from(w.len - off).unwrap_or(usize::MAX));
            if w.mem
                .read_slice(&mut buf[done..done + n], GuestAddress(w.gpa + off))
                .is_err()
            {
                buf[done..done + n].fill(0xff);
                ok = false;
            }
            done += n;
        }
        ok
    }

    /// Writes `data` at `iova`. Bytes outside every window are dropped; returns false if any byte
    /// missed.
    pub(crate) fn write(&self, iova: u64, data: &[u8]) -> bool {
        let mut ok = true;
        let mut done = 0usize;
        while done < data.len() {
            let a = iova.saturating_add(done as u64);
            let rest = data.len() - done;
            let Some((w, off)) = self.lookup(a) else {
                ok = false;
                done += self.gap_len(a, rest);
                continue;
            };
            let n = rest.min(usize::try_from(w.len - off).unwrap_or(usize::MAX));
            if w.mem
                .write_slice(&data[done..done + n], GuestAddress(w.gpa + off))
                .is_err()
            {
                ok = false;
            }
            done += n;
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ram(size: usize) -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0x10000), size)]).expect("guest memory")
    }

    #[test]
    fn map_checks_emptiness_backing_and_overlap() {
        let mut d = DmaWindows::default();
        let mem = ram(0x4000);
        assert_eq!(
            d.map(Iova(0x1000), 0, mem.clone(), Gpa(0x10000)),
            Err(DmaError::Empty {
                iova: Iova(0x1000),
                len: 0
            })
        );
        assert!(matches!(
            d.map(Iova(0), 0x5000, mem.clone(), Gpa(0x10000)),
            Err(DmaError::NotBacked { .. })
        ));
        assert!(matches!(
            d.map(Iova(u64::MAX), 2, mem.clone(), Gpa(0x10000)),
            Err(DmaError::Empty { .. })
        ));
        d.map(Iova(0x10_0000), 0x2000, mem.clone(), Gpa(0x10000))
            .expect("first window");
        assert_eq!(
            d.map(Iova(0x10_1000), 0x1000, mem.clone(), Gpa(0x12000)),
            Err(DmaError::Overlap {
                iova: Iova(0x10_1000)
            })
        );
        assert_eq!(
            d.map(Iova(0x0f_f000), 0x2000, mem.clone(), Gpa(0x12000)),
            Err(DmaError::Overlap {
                iova: Iova(0x0f_f000)
            })
        );
        d.map(Iova(0x10_2000), 0x2000, mem, Gpa(0x12000))
            .expect("adjacent window");
        assert_eq!(
            d.unmap(Iova(0x10_1000)),
            Err(DmaError::NoSuchWindow(Iova(0x10_1000)))
        );
        d.unmap(Iova(0x10_0000)).expect("unmap");
    }

    #[test]
    fn accesses_reach_guest_memory_and_misses_read_all_ones() {
        let mut d = DmaWindows::default();
        let mem = ram(0x4000);
        d.map(Iova(0x8000), 0x1000, mem.clone(), Gpa(0x11000))
            .expect("window");
        assert!(d.write(0x8ffe, &[1, 2]));
        let mut b = [0u8; 2];
        mem.read_slice(&mut b, GuestAddress(0x11ffe))
            .expect("read back");
        assert_eq!(b, [1, 2]);
        let mut b4 = [0u8; 4];
        assert!(!d.read(0x8ffe, &mut b4), "crosses the window end");
        assert_eq!(b4, [1, 2, 0xff, 0xff]);
        assert!(!d.write(0x9000, &[5]));
    }
}
