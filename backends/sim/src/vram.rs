//! Sparse video memory: the simulated GF100's on-board GDDR5 (a Quadro 6000 has 6 GiB behind
//! six frame-buffer partitions), kept in a **memfd** mapped shared (`MAP_SHARED|MAP_NORESERVE`),
//! so a VMM can map the same pages into a guest (GPUvm's BAR remap: KVM memory slots over this
//! mapping, [`gpuvm_phys::PhysicalGpu::vram_backing`]) or hand the file descriptor to another
//! process.
//!
//! The kernel keeps it lazy: a page of the memfd costs memory only once written, and filling
//! with zero punches a hole (`fallocate(PUNCH_HOLE)`), so scrubbing a large slice gives the
//! memory back. Reads of a shared mapping would allocate the pages they touch, so reads of a
//! 64 KiB chunk the simulator itself never wrote go through `pread` on the file instead (holes
//! read as zero without allocating; pages a guest wrote through its own mapping are seen).
//! A 6 GiB VRAM costs a 96 KiB table of chunk flags until something is written.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nix::fcntl::{fallocate, FallocateFlags};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{MapFlags, ProtFlags};
use nix::unistd::{lseek, Whence};
use vm_memory::mmap::MmapRegion;
use vm_memory::{FileOffset, VolatileMemory, VolatileSlice};

/// Size of the unit the simulator tracks its own writes in.
const CHUNK_SIZE: u64 = 64 * 1024;
const CHUNK_SHIFT: u32 = 16;
/// Host page size the file and mapping are rounded to.
const HOST_PAGE: u64 = 4096;

/// The VRAM contents.
#[derive(Debug)]
pub(crate) struct Vram {
    size: u64,
    file: Arc<File>,
    map: MmapRegion,
    /// Chunks the simulator wrote through the mapping (read back through it too); the others
    /// are read with `pread`. Atomic, so that the VRAM can be reached without the simulator's
    /// lock (`SimGpu`'s VRAM accesses with the engine worker): both ways read the same pages,
    /// the flag only decides whether a read may allocate them.
    written: Vec<AtomicBool>,
}

/// Where the VRAM lives on the host, for mapping it elsewhere.
#[derive(Debug, Clone)]
pub(crate) struct Backing {
    pub file: Arc<File>,
    pub host_addr: u64,
    pub len: u64,
}

impl Vram {
    /// An all-zero VRAM of `size` bytes.
    ///
    /// Panics if the host cannot create or map the memfd (no memory at all, or a kernel
    /// without `memfd_create`): the simulator cannot exist without its memory.
    pub(crate) fn new(size: u64) -> Vram {
        let len = size.max(1).next_multiple_of(HOST_PAGE);
        let fd = memfd_create(c"gpuvm-vram", MFdFlags::MFD_CLOEXEC)
            .expect("memfd_create for the simulated VRAM");
        let file = File::from(fd);
        file.set_len(len).expect("sizing the simulated VRAM memfd");
        let map = MmapRegion::build(
            Some(FileOffset::new(
                file.try_clone().expect("dup of the VRAM memfd"),
                0,
            )),
            usize::try_from(len).expect("VRAM size fits the address space"),
            (ProtFlags::PROT_READ | ProtFlags::PROT_WRITE).bits(),
            (MapFlags::MAP_SHARED | MapFlags::MAP_NORESERVE).bits(),
        )
        .expect("mapping the simulated VRAM");
        let chunks = usize::try_from(size.div_ceil(CHUNK_SIZE)).unwrap_or(0);
        Vram {
            size,
            file: Arc::new(file),
            map,
            written: (0..chunks).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// The memfd and the mapping (valid as long as this VRAM exists).
    pub(crate) fn backing(&self) -> Backing {
        Backing {
            file: self.file.clone(),
            host_addr: self.map.as_ptr() as u64,
            len: self.map.size() as u64,
        }
    }

    /// Number of 64 KiB chunks holding at least one allocated page (the kernel's view, from
    /// `SEEK_DATA`/`SEEK_HOLE`).
    pub(crate) fn allocated_chunks(&self) -> usize {
        let end = self.map.size() as i64;
        let mut count = 0usize;
        let mut last_chunk: Option<i64> = None;
        let mut pos = 0i64;
        while pos < end {
            let Ok(data) = lseek(&*self.file, pos, Whence::SeekData) else {
                break;
            };
            let hole = lseek(&*self.file, data, Whence::SeekHole).unwrap_or(end);
            let (first, last) = (data >> CHUNK_SHIFT, (hole - 1) >> CHUNK_SHIFT);
            let first = match last_chunk {
                Some(l) if l >= first => l + 1,
                _ => first,
            };
            if last >= first {
                count += (last - first + 1) as usize;
            }
            last_chunk = Some(last_chunk.map_or(last, |l| l.max(last)));
            pos = hole;
        }
        count
    }

    /// Bytes of `[addr, addr + len)` backed by host pages (written at least once and not
    /// scrubbed since; the kernel's view, page-granular, from `SEEK_DATA`/`SEEK_HOLE`).
    pub(crate) fn resident_bytes(&self, addr: u64, len: u64) -> u64 {
        self.resident_ranges(addr, len).iter().map(|r| r.1).sum()
    }

    /// The written ranges `(start, len)` of `[addr, addr + len)`, in order.
    pub(crate) fn resident_ranges(&self, addr: u64, len: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let end = addr.saturating_add(len).min(self.map.size() as u64) as i64;
        let mut pos = addr.min(i64::MAX as u64) as i64;
        while pos < end {
            let Ok(data) = lseek(&*self.file, pos, Whence::SeekData) else {
                break;
            };
            if data >= end {
                break;
            }
            let hole = lseek(&*self.file, data, Whence::SeekHole).unwrap_or(end);
            out.push((data as u64, (hole.min(end) - data) as u64));
            pos = hole;
        }
        out
    }

    /// Reads `buf.len()` bytes at `addr`. Bytes beyond the end of VRAM are set to zero and the
    /// function returns false.
    pub(crate) fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        let mut done = 0usize;
        while done < buf.len() {
            let a = addr.saturating_add(done as u64);
            if a >= self.size {
                buf[done..].fill(0);
                return false;
            }
            let (idx, off) = split(a);
            let n = piece_len(off, buf.len() - done, self.size - a);
            let piece = &mut buf[done..done + n];
            if self
                .written
                .get(idx)
                .is_some_and(|w| w.load(Ordering::Acquire))
            {
                match self.map.get_slice(a as usize, n) {
                    Ok(s) => {
                        s.copy_to(piece);
                    }
                    Err(_) => piece.fill(0),
                }
            } else if self.file.read_exact_at(piece, a).is_err() {
                piece.fill(0);
            }
            done += n;
        }
        true
    }

    /// Writes `data` at `addr`. Bytes beyond the end of VRAM are dropped and the function
    /// returns false.
    pub(crate) fn write(&self, addr: u64, data: &[u8]) -> bool {
        let mut done = 0usize;
        while done < data.len() {
            let a = addr.saturating_add(done as u64);
            if a >= self.size {
                return false;
            }
            let (idx, off) = split(a);
            let n = piece_len(off, data.len() - done, self.size - a);
            if let Ok(s) = self.map.get_slice(a as usize, n) {
                s.copy_from(&data[done..done + n]);
                if let Some(w) = self.written.get(idx) {
                    w.store(true, Ordering::Release);
                }
            }
            done += n;
        }
        true
    }

    /// `[addr, addr + len)` in place for a read, if it lies within one chunk (a page does)
    /// that the simulator has written through the mapping: other chunks are read with `pread`
    /// ([`Vram::read`]), so that reading them allocates nothing.
    pub(crate) fn read_slice(&self, addr: u64, len: usize) -> Option<VolatileSlice<'_>> {
        let written = self.written.get(split(addr).0)?.load(Ordering::Acquire);
        (self.in_one_chunk(addr, len) && written)
            .then(|| self.map.get_slice(addr as usize, len).ok())
            .flatten()
    }

    /// `[addr, addr + len)` in place for a write, if it lies within one chunk and VRAM; the
    /// chunk counts as written from then on ([`Vram::write`]).
    pub(crate) fn write_slice(&self, addr: u64, len: usize) -> Option<VolatileSlice<'_>> {
        let slice = self
            .in_one_chunk(addr, len)
            .then(|| self.map.get_slice(addr as usize, len).ok())
            .flatten()?;
        self.written
            .get(split(addr).0)?
            .store(true, Ordering::Release);
        Some(slice)
    }

    /// Whether `[addr, addr + len)` (`len` > 0) lies within VRAM and one 64 KiB chunk.
    pub(crate) fn in_one_chunk(&self, addr: u64, len: usize) -> bool {
        let (_, off) = split(addr);
        len > 0
            && addr.checked_add(len as u64).is_some_and(|e| e <= self.size)
            && off + len <= CHUNK_SIZE as usize
    }

    /// Fills `len` bytes from `addr` with `byte`; bytes beyond the end of VRAM are dropped.
    /// Filling at least a chunk (64 KiB) with zero punches a hole: the pages it covers entirely
    /// go back to the kernel (and read as zero), partial pages at either end are zeroed in place.
    pub(crate) fn fill(&self, addr: u64, len: u64, byte: u8) {
        let end = addr.saturating_add(len).min(self.size);
        if addr >= end {
            return;
        }
        // Zeroing less than a chunk in place is much cheaper than a hole punch (a syscall that
        // also walks the mapping's page tables): shadow page tables and other small hypervisor
        // allocations are scrubbed this way. Large ranges (slices) are punched.
        if byte == 0 && end - addr >= CHUNK_SIZE {
            let punched = fallocate(
                &*self.file,
                FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
                addr as i64,
                (end - addr) as i64,
            );
            if punched.is_ok() {
                // Chunks entirely inside the hole read as zero through `pread` again.
                let first = addr.div_ceil(CHUNK_SIZE);
                let last = end >> CHUNK_SHIFT;
                for c in first..last {
                    if let Some(w) = self.written.get(c as usize) {
                        w.store(false, Ordering::Release);
                    }
                }
                return;
            }
        }
        const PIECE: usize = 64 * 1024;
        let buf = [byte; PIECE];
        let mut a = addr;
        while a < end {
            let n = (end - a).min(PIECE as u64) as usize;
            self.write(a, &buf[..n]);
            a += n as u64;
        }
    }
}

/// Chunk index and offset inside the chunk of `addr`.
fn split(addr: u64) -> (usize, usize) {
    (
        (addr >> CHUNK_SHIFT) as usize,
        (addr & (CHUNK_SIZE - 1)) as usize,
    )
}

/// Bytes that can be handled in one piece from chunk offset `off`: bounded by the chunk end, the
/// bytes still wanted and the bytes left before the end of VRAM.
fn piece_len(off: usize, wanted: usize, left_in_vram: u64) -> usize {
    let in_chunk = CHUNK_SIZE as usize - off;
    let left = usize::try_from(left_in_vram).unwrap_or(usize::MAX);
    in_chunk.min(wanted).min(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn six_gib_allocates_nothing_until_written() {
        let v = Vram::new(6 << 30);
        assert_eq!(v.allocated_chunks(), 0);
        let mut buf = [0xaau8; 16];
        assert!(v.read(5 << 30, &mut buf));
        assert_eq!(buf, [0u8; 16]);
        assert_eq!(v.allocated_chunks(), 0, "reads never allocate");
        assert!(v.write(5 << 30, &[1, 2, 3]));
        assert_eq!(v.allocated_chunks(), 1);
    }

    #[test]
    fn resident_bytes_count_written_pages_in_a_range() {
        let v = Vram::new(4 << 20);
        assert_eq!(v.resident_bytes(0, 4 << 20), 0);
        v.write(1 << 20, &[1; 8]);
        v.write(3 << 20, &[1; 8192]);
        let page = 4096;
        assert_eq!(v.resident_bytes(0, 4 << 20), 3 * page);
        assert_eq!(v.resident_bytes(0, 2 << 20), page, "only the first write");
        assert_eq!(
            v.resident_bytes(3 << 20, page),
            page,
            "clipped to the range"
        );
        // A slice scrub (whole chunks of zeros) frees the pages; smaller zero-fills are done in
        // place and keep them.
        v.fill(3 << 20, CHUNK_SIZE, 0);
        assert_eq!(
            v.resident_bytes(0, 4 << 20),
            page,
            "a scrub frees the pages"
        );
    }

    #[test]
    fn accesses_cross_chunk_boundaries() {
        let v = Vram::new(1 << 20);
        let data: Vec<u8> = (0..200u32).map(|i| i as u8).collect();
        assert!(v.write(CHUNK_SIZE - 100, &data));
        let mut back = vec![0u8; 200];
        assert!(v.read(CHUNK_SIZE - 100, &mut back));
        assert_eq!(back, data);
        assert_eq!(v.allocated_chunks(), 2);
    }

    #[test]
    fn fill_with_zero_releases_whole_chunks() {
        let v = Vram::new(1 << 20);
        assert!(v.write(0, &vec![7u8; 3 * CHUNK_SIZE as usize]));
        assert_eq!(v.allocated_chunks(), 3);
        // Covers the tail of chunk 0, all of chunk 1 and the head of chunk 2.
        v.fill(CHUNK_SIZE - 4, CHUNK_SIZE + 8, 0);
        assert_eq!(v.allocated_chunks(), 2, "the whole middle chunk is dropped");
        let mut b = [0u8; 8];
        assert!(v.read(CHUNK_SIZE - 6, &mut b));
        assert_eq!(b, [7, 7, 0, 0, 0, 0, 0, 0]);
        assert!(v.read(2 * CHUNK_SIZE + 2, &mut b));
        assert_eq!(b, [0, 0, 7, 7, 7, 7, 7, 7]);
        v.fill(5 * CHUNK_SIZE + 1, 2, 0xab);
        assert!(v.read(5 * CHUNK_SIZE, &mut b[..4]));
        assert_eq!(&b[..4], &[0, 0xab, 0xab, 0]);
        v.fill((1 << 20) - 2, 100, 1);
        v.fill(u64::MAX - 1, 10, 0);
        assert!(v.read((1 << 20) - 2, &mut b[..2]));
        assert_eq!(&b[..2], &[1, 1]);
    }

    #[test]
    fn the_memfd_is_the_memory() {
        let v = Vram::new(1 << 20);
        let b = v.backing();
        assert!(b.len >= 1 << 20);
        assert_ne!(b.host_addr, 0);
        // Another mapper's write (through the file here) is seen by the simulator, in chunks
        // it wrote before and in chunks it never touched.
        assert!(v.write(0x100, &[1, 2, 3, 4]));
        b.file.write_all_at(&[9, 9], 0x102).unwrap();
        b.file.write_all_at(&[5, 6], 3 * CHUNK_SIZE).unwrap();
        let mut r = [0u8; 4];
        assert!(v.read(0x100, &mut r));
        assert_eq!(r, [1, 2, 9, 9]);
        assert!(v.read(3 * CHUNK_SIZE, &mut r));
        assert_eq!(r, [5, 6, 0, 0]);
        // And the simulator's writes are in the file.
        let mut f = [0u8; 2];
        b.file.read_exact_at(&mut f, 0x100).unwrap();
        assert_eq!(f, [1, 2]);
        v.fill(0, 1 << 20, 0);
        assert_eq!(v.allocated_chunks(), 0, "zero-fill gives every page back");
        assert!(v.read(3 * CHUNK_SIZE, &mut r));
        assert_eq!(r, [0; 4]);
    }

    #[test]
    fn beyond_the_end_reads_zero_and_drops_writes() {
        let v = Vram::new(1 << 20);
        assert!(!v.write((1 << 20) - 2, &[9, 9, 9, 9]));
        let mut buf = [0xffu8; 4];
        assert!(!v.read((1 << 20) - 2, &mut buf));
        assert_eq!(buf, [9, 9, 0, 0]);
        assert!(!v.read(u64::MAX - 1, &mut buf));
        assert_eq!(buf, [0; 4]);
        assert!(!v.write(u64::MAX, &[1]));
    }
}
