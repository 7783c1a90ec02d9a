//! Sparse, lazily allocated video memory: the simulated GF100's on-board GDDR5 (a Quadro 6000 has
//! 6 GiB behind six frame-buffer partitions).
//!
//! VRAM is split into 64 KiB chunks that are allocated on their first write; never-written chunks
//! read as zero without allocating. A 6 GiB VRAM therefore costs a table of 98,304 empty slots
//! (768 KiB) until the GPU or the hypervisor actually writes to it.

/// Size of an allocation chunk.
const CHUNK_SIZE: u64 = 64 * 1024;
const CHUNK_SHIFT: u32 = 16;

/// The VRAM contents.
#[derive(Debug)]
pub(crate) struct Vram {
    size: u64,
    chunks: Vec<Option<Box<[u8]>>>,
}

impl Vram {
    /// An all-zero VRAM of `size` bytes (rounded up to whole chunks internally).
    pub(crate) fn new(size: u64) -> Vram {
        let count = size.div_ceil(CHUNK_SIZE);
        let mut chunks = Vec::new();
        chunks.resize_with(usize::try_from(count).unwrap_or(0), || None);
        Vram { size, chunks }
    }

    /// Size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Number of chunks currently allocated (for tests of the lazy allocation).
    pub(crate) fn allocated_chunks(&self) -> usize {
        self.chunks.iter().filter(|c| c.is_some()).count()
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
            match self.chunks.get(idx).and_then(|c| c.as_deref()) {
                Some(chunk) => buf[done..done + n].copy_from_slice(&chunk[off..off + n]),
                None => buf[done..done + n].fill(0),
            }
            done += n;
        }
        true
    }

    /// Writes `data` at `addr`, allocating chunks as needed. Bytes beyond the end of VRAM are
    /// dropped and the function returns false.
    pub(crate) fn write(&mut self, addr: u64, data: &[u8]) -> bool {
        let mut done = 0usize;
        while done < data.len() {
            let a = addr.saturating_add(done as u64);
            if a >= self.size {
                return false;
            }
            let (idx, off) = split(a);
            let n = piece_len(off, data.len() - done, self.size - a);
            if let Some(slot) = self.chunks.get_mut(idx) {
                let chunk =
                    slot.get_or_insert_with(|| vec![0u8; CHUNK_SIZE as usize].into_boxed_slice());
                chunk[off..off + n].copy_from_slice(&data[done..done + n]);
            }
            done += n;
        }
        true
    }

    /// Fills `len` bytes from `addr` with `byte`; bytes beyond the end of VRAM are dropped.
    /// Filling with zero drops every chunk it covers entirely (they read as zero again and cost
    /// no host memory) and zeroes only the allocated parts of the chunks at either end, so
    /// scrubbing a large, mostly untouched VRAM slice is cheap.
    pub(crate) fn fill(&mut self, addr: u64, len: u64, byte: u8) {
        let end = addr.saturating_add(len).min(self.size);
        let mut a = addr;
        while a < end {
            let (idx, off) = split(a);
            let n = piece_len(off, usize::try_from(end - a).unwrap_or(usize::MAX), end - a);
            let Some(slot) = self.chunks.get_mut(idx) else {
                return;
            };
            if byte == 0 {
                if n == CHUNK_SIZE as usize {
                    *slot = None;
                } else if let Some(chunk) = slot.as_deref_mut() {
                    chunk[off..off + n].fill(0);
                }
            } else {
                let chunk =
                    slot.get_or_insert_with(|| vec![0u8; CHUNK_SIZE as usize].into_boxed_slice());
                chunk[off..off + n].fill(byte);
            }
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
        let mut v = Vram::new(6 << 30);
        assert_eq!(v.allocated_chunks(), 0);
        let mut buf = [0xaau8; 16];
        assert!(v.read(5 << 30, &mut buf));
        assert_eq!(buf, [0u8; 16]);
        assert_eq!(v.allocated_chunks(), 0, "reads never allocate");
        assert!(v.write(5 << 30, &[1, 2, 3]));
        assert_eq!(v.allocated_chunks(), 1);
    }

    #[test]
    fn accesses_cross_chunk_boundaries() {
        let mut v = Vram::new(1 << 20);
        let data: Vec<u8> = (0..200u32).map(|i| i as u8).collect();
        assert!(v.write(CHUNK_SIZE - 100, &data));
        let mut back = vec![0u8; 200];
        assert!(v.read(CHUNK_SIZE - 100, &mut back));
        assert_eq!(back, data);
        assert_eq!(v.allocated_chunks(), 2);
    }

    #[test]
    fn fill_with_zero_releases_whole_chunks() {
        let mut v = Vram::new(1 << 20);
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
    fn beyond_the_end_reads_zero_and_drops_writes() {
        let mut v = Vram::new(1 << 20);
        assert!(!v.write((1 << 20) - 2, &[9, 9, 9, 9]));
        let mut buf = [0xffu8; 4];
        assert!(!v.read((1 << 20) - 2, &mut buf));
        assert_eq!(buf, [9, 9, 0, 0]);
        assert!(!v.read(u64::MAX - 1, &mut buf));
        assert_eq!(buf, [0; 4]);
        assert!(!v.write(u64::MAX, &[1]));
    }
}
