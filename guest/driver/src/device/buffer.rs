//! Buffers: memory the GPU reaches through a channel VM, and (optionally) the CPU reaches too.
//! The role of nouveau's `nouveau_bo` for the few kinds this driver needs:
//!
//! - VRAM buffers, mapped into the channel VM with VRAM PTEs (large pages when allowed and the
//!   buffer is at least 128 KiB); with CPU access they are also mapped into BAR1 and read or
//!   written there word by word (nouveau `nouveau_bo_rd32`/`_wr32` on a BAR1 `kmap`);
//! - guest-RAM buffers ("GART"), page-granular, mapped with SYSRAM-coherent PTEs with VOL; the
//!   CPU reaches them directly through `Dma`.

use gf100::mmu;

use crate::config::MemLocation;
use crate::device::Gpu;
use crate::error::DriverError;
use crate::hal::Bar;
use crate::sysmem::DmaAlloc;
use crate::vm::{AddressSpace, Backing, PageSize};
use crate::vram::VramAlloc;
use crate::Hal;

#[derive(Debug)]
enum Memory {
    Vram(VramAlloc),
    Sysram(DmaAlloc),
}

/// A buffer mapped into a channel VM.
#[derive(Debug)]
pub struct Buffer {
    mem: Memory,
    size: u64,
    va: u64,
    page: PageSize,
    mapped: u64,
    bar1: Option<u64>,
}

impl Buffer {
    /// GPU virtual address in its channel VM.
    pub fn va(&self) -> u64 {
        self.va
    }
    /// Size requested, in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }
    /// Where it lives.
    pub fn location(&self) -> MemLocation {
        match self.mem {
            Memory::Vram(_) => MemLocation::Vram,
            Memory::Sysram(_) => MemLocation::Sysram,
        }
    }
    /// Physical address (VRAM address or guest bus address).
    pub fn phys(&self) -> u64 {
        match &self.mem {
            Memory::Vram(v) => v.addr(),
            Memory::Sysram(d) => d.addr(),
        }
    }
    /// Its BAR1 address, if it is mapped there for CPU access.
    pub fn bar1(&self) -> Option<u64> {
        self.bar1
    }

    /// Page size of its GPU mapping.
    pub fn page_size(&self) -> PageSize {
        self.page
    }
}

impl<H: Hal> Gpu<H> {
    /// Allocates a buffer of `size` bytes in `loc`, maps it into `vm`, and, if `cpu` is set and
    /// it lives in VRAM, into BAR1 for CPU access. Guest-RAM buffers are always CPU-accessible.
    pub fn buffer_new(
        &mut self,
        vm: &mut AddressSpace,
        size: u64,
        loc: MemLocation,
        cpu: bool,
    ) -> Result<Buffer, DriverError> {
        if size == 0 {
            return Err(DriverError::InvalidArgument {
                what: "zero-sized buffer",
            });
        }
        let page =
            if loc == MemLocation::Vram && self.cfg.large_pages && size >= mmu::LARGE_PAGE_SIZE {
                PageSize::Large
            } else {
                PageSize::Small
            };
        let pg = page.bytes();
        let mapped = size
            .div_ceil(pg)
            .checked_mul(pg)
            .ok_or(DriverError::InvalidArgument {
                what: "buffer size",
            })?;
        let mem = match loc {
            MemLocation::Vram => Memory::Vram(self.vram.alloc(mapped, pg)?),
            MemLocation::Sysram => Memory::Sysram(self.dma.alloc(mapped, pg)?),
        };
        let backing = match &mem {
            Memory::Vram(v) => Backing::Vram(v.addr()),
            Memory::Sysram(d) => Backing::Sysram(d.addr()),
        };
        let mut buf = Buffer {
            mem,
            size,
            va: 0,
            page,
            mapped: 0,
            bar1: None,
        };
        let r = (|| {
            buf.va = self.vm_alloc_va(vm, mapped, page)?;
            buf.mapped = mapped;
            self.vm_map(vm, buf.va, backing, mapped, page)?;
            if cpu {
                if let Memory::Vram(v) = &buf.mem {
                    let (addr, sz) = (v.addr(), v.size());
                    buf.bar1 = Some(self.bar_map_vram(Bar::Bar1, addr, sz)?);
                }
            }
            Ok(())
        })();
        match r {
            Ok(()) => Ok(buf),
            Err(e) => {
                let _ = self.buffer_free(vm, buf);
                Err(e)
            }
        }
    }

    /// Unmaps and frees a buffer.
    pub fn buffer_free(&mut self, vm: &mut AddressSpace, buf: Buffer) -> Result<(), DriverError> {
        let Buffer {
            mem,
            va,
            page,
            mapped,
            bar1,
            ..
        } = buf;
        let mut first_err = None;
        if let (Some(bva), Memory::Vram(v)) = (bar1, &mem) {
            let sz = v.size();
            if let Err(e) = self.bar_unmap(Bar::Bar1, bva, sz) {
                first_err.get_or_insert(e);
            }
        }
        if mapped != 0 {
            if let Err(e) = self.vm_unmap(vm, va, mapped, page) {
                first_err.get_or_insert(e);
            }
            if let Err(e) = self.vm_free_va(vm, va, mapped, page) {
                first_err.get_or_insert(e);
            }
        }
        let r = match mem {
            Memory::Vram(v) => self.vram.free(v),
            Memory::Sysram(d) => self.dma.free(d),
        };
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
        first_err.map_or(Ok(()), Err)
    }

    fn buffer_check(buf: &Buffer, off: u64, len: u64) -> Result<(), DriverError> {
        match off.checked_add(len) {
            Some(end) if end <= buf.size => Ok(()),
            _ => Err(DriverError::InvalidArgument {
                what: "buffer access out of bounds",
            }),
        }
    }

    /// Writes 32-bit words at byte offset `off` (4-byte aligned).
    pub fn buffer_write_words(
        &mut self,
        buf: &Buffer,
        off: u64,
        words: &[u32],
    ) -> Result<(), DriverError> {
        Self::buffer_check(buf, off, words.len() as u64 * 4)?;
        if !off.is_multiple_of(4) {
            return Err(DriverError::InvalidArgument {
                what: "unaligned buffer access",
            });
        }
        match &buf.mem {
            Memory::Sysram(d) => {
                let mut chunk = [0u8; 1024];
                let mut at = d.addr() + off;
                for ws in words.chunks(chunk.len() / 4) {
                    for (i, w) in ws.iter().enumerate() {
                        chunk[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
                    }
                    self.hal.write(at, &chunk[..ws.len() * 4]);
                    at += ws.len() as u64 * 4;
                }
            }
            Memory::Vram(_) => {
                let bar1 = buf.bar1.ok_or(DriverError::InvalidArgument {
                    what: "VRAM buffer without CPU mapping",
                })?;
                for (i, w) in words.iter().enumerate() {
                    self.hal.write32(Bar::Bar1, bar1 + off + i as u64 * 4, *w);
                }
            }
        }
        Ok(())
    }

    /// Reads 32-bit words at byte offset `off` (4-byte aligned).
    pub fn buffer_read_words(
        &mut self,
        buf: &Buffer,
        off: u64,
        words: &mut [u32],
    ) -> Result<(), DriverError> {
        Self::buffer_check(buf, off, words.len() as u64 * 4)?;
        if !off.is_multiple_of(4) {
            return Err(DriverError::InvalidArgument {
                what: "unaligned buffer access",
            });
        }
        match &buf.mem {
            Memory::Sysram(d) => {
                let mut chunk = [0u8; 1024];
                let mut at = d.addr() + off;
                for ws in words.chunks_mut(chunk.len() / 4) {
                    let n = ws.len() * 4;
                    self.hal.read(at, &mut chunk[..n]);
                    for (i, w) in ws.iter_mut().enumerate() {
                        *w = u32::from_le_bytes([
                            chunk[i * 4],
                            chunk[i * 4 + 1],
                            chunk[i * 4 + 2],
                            chunk[i * 4 + 3],
                        ]);
                    }
                    at += n as u64;
                }
            }
            Memory::Vram(_) => {
                let bar1 = buf.bar1.ok_or(DriverError::InvalidArgument {
                    what: "VRAM buffer without CPU mapping",
                })?;
                for (i, w) in words.iter_mut().enumerate() {
                    *w = self.hal.read32(Bar::Bar1, bar1 + off + i as u64 * 4);
                }
            }
        }
        Ok(())
    }

    /// Reads one word.
    pub fn buffer_rd32(&mut self, buf: &Buffer, off: u64) -> Result<u32, DriverError> {
        let mut w = [0u32; 1];
        self.buffer_read_words(buf, off, &mut w)?;
        Ok(w[0])
    }

    /// Reads a 64-bit value (low word first).
    pub fn buffer_rd64(&mut self, buf: &Buffer, off: u64) -> Result<u64, DriverError> {
        let mut w = [0u32; 2];
        self.buffer_read_words(buf, off, &mut w)?;
        Ok((w[1] as u64) << 32 | w[0] as u64)
    }

    /// Writes one word.
    pub fn buffer_wr32(&mut self, buf: &Buffer, off: u64, v: u32) -> Result<(), DriverError> {
        self.buffer_write_words(buf, off, &[v])
    }

    /// Fills `len` bytes from `off` with a repeated word.
    pub fn buffer_fill(
        &mut self,
        buf: &Buffer,
        off: u64,
        len: u64,
        v: u32,
    ) -> Result<(), DriverError> {
        let words = [v; 256];
        let mut done = 0;
        while done < len {
            let n = ((len - done) / 4).min(words.len() as u64) as usize;
            if n == 0 {
                break;
            }
            self.buffer_write_words(buf, off + done, &words[..n])?;
            done += n as u64 * 4;
        }
        Ok(())
    }
}
