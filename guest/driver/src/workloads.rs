//! Gdev-style microbenchmarks (`gdev/test/cuda/user/{madd,mmul,fmadd,fmmul,memcpy,loop}`), each
//! checked against a CPU reference computed in the guest ([`crate::reference`]).
//!
//! The data path is Gdev's: the CPU writes inputs into guest RAM, the copy engine moves them to
//! VRAM through the channel VM (guest pages mapped with SYSRAM PTEs), the kernel runs on VRAM
//! buffers, the result is copied back to guest RAM and compared on the CPU. Destination buffers
//! are poisoned first, so a copy or kernel that does nothing cannot pass.
//!
//! `gpu_ns` is the difference of the GPU timestamps of two 16-byte semaphore releases ("queries",
//! always 16 bytes whatever the fence size) bracketing the timed GPU work. `bytes` is the data the workload moves
//! between host and device: `size*size*4` for the memcpy workloads, `3*size*size*4` (two inputs
//! in, one result out) for the arithmetic ones, 4 for `loop`.

use alloc::vec::Vec;
use core::fmt;
use core::str::FromStr;

use gf100::compute::{self, Kernel};

use crate::buffer::Buffer;
use crate::channel::Channel;
use crate::config::MemLocation;
use crate::device::Gpu;
use crate::error::DriverError;
use crate::hal::{Dma, Mmio, Platform};
use crate::push::PushBuf;
use crate::reference;
use crate::Hal;

/// Pattern written into destination buffers before the GPU fills them.
pub const POISON: u32 = 0xdead_beef;
/// `loop` iterations per matrix element: `size*size*LOOP_ITERATIONS_PER_ELEMENT`.
pub const LOOP_ITERATIONS_PER_ELEMENT: u64 = 64;
/// Largest iteration count the `loop` reference iterates naively.
pub const LOOP_NAIVE_LIMIT: u64 = 1 << 26;
/// Multiply-adds the matrix references may spend; beyond it rows are sampled.
pub const MATRIX_CHECK_BUDGET: u64 = 1 << 27;

/// Query slots of the timestamps bracketing the timed GPU work.
const TS_START: u32 = 0;
const TS_END: u32 = 1;

/// A workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Workload {
    /// u32 element-wise add of two `size`x`size` matrices.
    Madd,
    /// u32 product of two `size`x`size` matrices.
    Mmul,
    /// f32 element-wise add.
    Fmadd,
    /// f32 matrix product.
    Fmmul,
    /// Copy `size*size*4` bytes from guest RAM to VRAM.
    MemcpyHtod,
    /// Copy `size*size*4` bytes from VRAM to guest RAM.
    MemcpyDtoh,
    /// The loop kernel, `size*size*64` iterations.
    Loop,
}

impl Workload {
    /// Every workload, in the order Gdev's suite lists them.
    pub const ALL: [Workload; 7] = [
        Workload::Madd,
        Workload::Mmul,
        Workload::Fmadd,
        Workload::Fmmul,
        Workload::MemcpyHtod,
        Workload::MemcpyDtoh,
        Workload::Loop,
    ];

    /// The name used on command lines and in reports.
    pub fn name(&self) -> &'static str {
        match self {
            Workload::Madd => "madd",
            Workload::Mmul => "mmul",
            Workload::Fmadd => "fmadd",
            Workload::Fmmul => "fmmul",
            Workload::MemcpyHtod => "memcpy_htod",
            Workload::MemcpyDtoh => "memcpy_dtoh",
            Workload::Loop => "loop",
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A workload name that is not one of [`Workload::ALL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownWorkload;

impl fmt::Display for UnknownWorkload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("unknown workload (expected one of madd, mmul, fmadd, fmmul, memcpy_htod, memcpy_dtoh, loop)")
    }
}

impl core::error::Error for UnknownWorkload {}

impl FromStr for Workload {
    type Err = UnknownWorkload;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Workload::ALL
            .iter()
            .copied()
            .find(|w| w.name() == s)
            .ok_or(UnknownWorkload)
    }
}

/// What a workload run measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadReport {
    /// Which workload.
    pub workload: Workload,
    /// Bytes moved between host and device (see the module docs).
    pub bytes: u64,
    /// GPU time between the timestamps around the GPU work, ns.
    pub gpu_ns: u64,
    /// The result matched the CPU reference.
    pub verified: bool,
}

/// Runs workload `w` at problem size `size` on `gpu`: sets up (or reuses) the workload channel,
/// runs, verifies, and frees the buffers it allocated. A channel the hardware reported an error
/// on is freed, so the next run starts with a fresh one.
pub fn run<H: Mmio + Dma + Platform>(
    gpu: &mut Gpu<H>,
    w: Workload,
    size: u32,
) -> Result<WorkloadReport, DriverError> {
    check_size(w, size)?;
    let mut ch = match gpu.chan.take() {
        Some(c) if !c.is_broken() => c,
        Some(c) => {
            let _ = gpu.channel_free(c);
            gpu.channel_new()?
        }
        None => gpu.channel_new()?,
    };
    let r = run_on(gpu, &mut ch, w, size);
    if ch.is_broken() {
        let _ = gpu.channel_free(ch);
    } else {
        gpu.chan = Some(ch);
    }
    r
}

/// Where the instance block of the channel the workloads keep between runs is mapped in BAR3
/// (offset into the BAR), if there is such a channel and its block is reached through BAR3.
/// For the `ro-write` hostile mode of the KVM guest, which writes into that block directly.
pub fn channel_inst_bar3<H: Mmio + Dma + Platform>(gpu: &Gpu<H>) -> Option<u64> {
    gpu.chan.as_ref().and_then(|c| c.inst.bar3_va)
}

/// Frees the channel the workloads keep between runs (if any).
pub fn release_channel<H: Mmio + Dma + Platform>(gpu: &mut Gpu<H>) -> Result<(), DriverError> {
    match gpu.chan.take() {
        Some(c) => gpu.channel_free(c),
        None => Ok(()),
    }
}

fn check_size(w: Workload, size: u32) -> Result<(), DriverError> {
    let n = (size as u64) * (size as u64);
    let ok = match w {
        _ if size == 0 => false,
        Workload::Mmul | Workload::Fmmul => size <= compute::MAX_MATRIX_DIM,
        Workload::Madd | Workload::Fmadd => n <= compute::MAX_ELEMENTS as u64,
        Workload::MemcpyHtod | Workload::MemcpyDtoh => n * 4 <= compute::MAX_MEMSET_BYTES as u64,
        Workload::Loop => true,
    };
    if ok {
        Ok(())
    } else {
        Err(DriverError::InvalidArgument {
            what: "workload size out of range",
        })
    }
}

/// Buffers of one workload run, freed together.
struct Bufs(Vec<Buffer>);

impl Bufs {
    fn alloc<H: Hal>(
        &mut self,
        gpu: &mut Gpu<H>,
        ch: &mut Channel,
        bytes: u64,
        loc: MemLocation,
    ) -> Result<usize, DriverError> {
        let b = gpu.buffer_new(ch.vm_mut(), bytes, loc, false)?;
        self.0.push(b);
        Ok(self.0.len() - 1)
    }

    fn free<H: Hal>(self, gpu: &mut Gpu<H>, ch: &mut Channel) -> Result<(), DriverError> {
        let mut first = None;
        for b in self.0 {
            if let Err(e) = gpu.buffer_free(ch.vm_mut(), b) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

fn run_on<H: Hal>(
    gpu: &mut Gpu<H>,
    ch: &mut Channel,
    w: Workload,
    size: u32,
) -> Result<WorkloadReport, DriverError> {
    let mut bufs = Bufs(Vec::new());
    let r = body(gpu, ch, &mut bufs, w, size);
    let freed = bufs.free(gpu, ch);
    let report = r?;
    freed?;
    Ok(report)
}

fn body<H: Hal>(
    gpu: &mut Gpu<H>,
    ch: &mut Channel,
    bufs: &mut Bufs,
    w: Workload,
    size: u32,
) -> Result<WorkloadReport, DriverError> {
    let n = size as usize * size as usize;
    let bytes = n as u64 * 4;
    let seed = 0x6764_6576 ^ ((size as u64) << 32) ^ w as u64;
    match w {
        Workload::Madd | Workload::Fmadd | Workload::Mmul | Workload::Fmmul => {
            let float = matches!(w, Workload::Fmadd | Workload::Fmmul);
            let (a, b) = if float {
                (
                    reference::gen_f32_bits(seed, n),
                    reference::gen_f32_bits(seed ^ 0x5555, n),
                )
            } else {
                (
                    reference::gen_u32(seed, n),
                    reference::gen_u32(seed ^ 0x5555, n),
                )
            };
            let sa = bufs.alloc(gpu, ch, bytes, MemLocation::Sysram)?;
            let sb = bufs.alloc(gpu, ch, bytes, MemLocation::Sysram)?;
            let sc = bufs.alloc(gpu, ch, bytes, MemLocation::Sysram)?;
            let va = bufs.alloc(gpu, ch, bytes, MemLocation::Vram)?;
            let vb = bufs.alloc(gpu, ch, bytes, MemLocation::Vram)?;
            let vc = bufs.alloc(gpu, ch, bytes, MemLocation::Vram)?;
            let b_ = &bufs.0;
            gpu.buffer_write_words(&b_[sa], 0, &a)?;
            gpu.buffer_write_words(&b_[sb], 0, &b)?;
            gpu.buffer_fill(&b_[sc], 0, bytes, POISON)?;
            let (gva, gvb, gvc) = (b_[va].va(), b_[vb].va(), b_[vc].va());
            let kernel = match w {
                Workload::Madd => Kernel::Madd {
                    a: gva,
                    b: gvb,
                    c: gvc,
                    n: n as u32,
                },
                Workload::Fmadd => Kernel::Fmadd {
                    a: gva,
                    b: gvb,
                    c: gvc,
                    n: n as u32,
                },
                Workload::Mmul => Kernel::Mmul {
                    a: gva,
                    b: gvb,
                    c: gvc,
                    n: size,
                },
                _ => Kernel::Fmmul {
                    a: gva,
                    b: gvb,
                    c: gvc,
                    n: size,
                },
            };
            let mut pb = PushBuf::new();
            ch.push_timestamp(&mut pb, TS_START);
            pb.copy(b_[sa].va(), gva, bytes);
            pb.copy(b_[sb].va(), gvb, bytes);
            pb.kernel(&kernel);
            pb.copy(gvc, b_[sc].va(), bytes);
            ch.push_timestamp(&mut pb, TS_END);
            let gpu_ns = execute(gpu, ch, &pb)?;
            let mut c = alloc::vec![0u32; n];
            gpu.buffer_read_words(&bufs.0[sc], 0, &mut c)?;
            let verified = match w {
                Workload::Madd => c == reference::madd(&a, &b),
                Workload::Fmadd => c == reference::fmadd(&a, &b),
                _ => {
                    let dim = size as usize;
                    reference::check_rows(dim, MATRIX_CHECK_BUDGET)
                        .into_iter()
                        .all(|i| {
                            let row = if w == Workload::Mmul {
                                reference::mmul_row(&a, &b, dim, i)
                            } else {
                                reference::fmmul_row(&a, &b, dim, i)
                            };
                            c[i * dim..(i + 1) * dim] == row[..]
                        })
                }
            };
            Ok(WorkloadReport {
                workload: w,
                bytes: 3 * bytes,
                gpu_ns,
                verified,
            })
        }
        Workload::MemcpyHtod | Workload::MemcpyDtoh => {
            let data = reference::gen_u32(seed, n);
            let src = bufs.alloc(gpu, ch, bytes, MemLocation::Sysram)?;
            let dev = bufs.alloc(gpu, ch, bytes, MemLocation::Vram)?;
            let dst = bufs.alloc(gpu, ch, bytes, MemLocation::Sysram)?;
            let b_ = &bufs.0;
            gpu.buffer_write_words(&b_[src], 0, &data)?;
            gpu.buffer_fill(&b_[dst], 0, bytes, POISON)?;
            let (s, d, o) = (b_[src].va(), b_[dev].va(), b_[dst].va());
            let mut pb = PushBuf::new();
            if w == Workload::MemcpyHtod {
                // Poison the device buffer, time the upload, read it back for the check.
                pb.kernel(&Kernel::Memset {
                    dst: d,
                    bytes: bytes as u32,
                    value: POISON,
                });
                ch.push_timestamp(&mut pb, TS_START);
                pb.copy(s, d, bytes);
                ch.push_timestamp(&mut pb, TS_END);
                pb.copy(d, o, bytes);
            } else {
                // Fill the device buffer, time the download.
                pb.copy(s, d, bytes);
                ch.push_timestamp(&mut pb, TS_START);
                pb.copy(d, o, bytes);
                ch.push_timestamp(&mut pb, TS_END);
            }
            let gpu_ns = execute(gpu, ch, &pb)?;
            let mut out = alloc::vec![0u32; n];
            gpu.buffer_read_words(&bufs.0[dst], 0, &mut out)?;
            Ok(WorkloadReport {
                workload: w,
                bytes,
                gpu_ns,
                verified: out == data,
            })
        }
        Workload::Loop => {
            let iterations = (n as u64).saturating_mul(LOOP_ITERATIONS_PER_ELEMENT);
            let start = reference::Rng::new(seed).next_u32();
            let dev = bufs.alloc(gpu, ch, 4, MemLocation::Vram)?;
            let out = bufs.alloc(gpu, ch, 4, MemLocation::Sysram)?;
            gpu.buffer_wr32(&bufs.0[out], 0, POISON)?;
            let (d, o) = (bufs.0[dev].va(), bufs.0[out].va());
            let mut pb = PushBuf::new();
            ch.push_timestamp(&mut pb, TS_START);
            pb.kernel(&Kernel::Loop {
                dst: d,
                iterations,
                seed: start,
            });
            pb.copy(d, o, 4);
            ch.push_timestamp(&mut pb, TS_END);
            let gpu_ns = execute(gpu, ch, &pb)?;
            let got = gpu.buffer_rd32(&bufs.0[out], 0)?;
            let verified = got == reference::loop_expected(start, iterations, LOOP_NAIVE_LIMIT);
            Ok(WorkloadReport {
                workload: w,
                bytes: 4,
                gpu_ns,
                verified,
            })
        }
    }
}

/// Submits `pb`, waits for it, and returns the GPU time between the two timestamps.
fn execute<H: Hal>(gpu: &mut Gpu<H>, ch: &mut Channel, pb: &PushBuf) -> Result<u64, DriverError> {
    let f = gpu.submit(ch, pb)?;
    gpu.fence_wait(ch, f)?;
    let t0 = gpu.query_timestamp(ch, TS_START)?;
    let t1 = gpu.query_timestamp(ch, TS_END)?;
    Ok(t1.saturating_sub(t0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for w in Workload::ALL {
            assert_eq!(w.name().parse::<Workload>(), Ok(w));
        }
        assert!("nope".parse::<Workload>().is_err());
        let names: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).collect();
        assert_eq!(
            names,
            [
                "madd",
                "mmul",
                "fmadd",
                "fmmul",
                "memcpy_htod",
                "memcpy_dtoh",
                "loop"
            ]
        );
    }

    #[test]
    fn size_limits() {
        assert!(check_size(Workload::Madd, 0).is_err());
        assert!(check_size(Workload::Mmul, 1024).is_ok());
        assert!(check_size(Workload::Mmul, 1025).is_err());
        assert!(check_size(Workload::Madd, 4096).is_ok());
        assert!(check_size(Workload::Madd, 4097).is_err());
        assert!(check_size(Workload::Loop, u32::MAX).is_ok());
    }
}
