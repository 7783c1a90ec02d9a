//! The pushbuffer builder: method headers and data words, in the formats nouveau emits
//! (`BEGIN_NVC0` incrementing headers, `nouveau_dma.h`), plus the command sequences this driver
//! uses: object binding (SET_OBJECT), host semaphores (`nvc0_fence_emit32`), the non-stall
//! interrupt, copy-engine transfers (`nvc0_bo_move_copy`: pitch lines of one page) and kernel
//! launches of the MODEL compute class.

use alloc::vec::Vec;

use gf100::compute::{self, Kernel};
use gf100::{copy, host, method};

/// Subchannel the driver binds the compute class to (Gdev `GDEV_SUBCH_NV_COMPUTE`).
pub const SUBC_COMPUTE: u32 = 1;
/// Subchannel the driver binds the copy class to (Gdev `GDEV_SUBCH_NV_PCOPY0`).
pub const SUBC_COPY: u32 = 4;
/// Subchannel used for host methods (valid on every subchannel; nouveau uses 0).
pub const SUBC_HOST: u32 = 0;

/// Line length of multi-line copies (one page, as nouveau's `nvc0_bo_move_copy`).
pub const COPY_LINE: u64 = gf100::PAGE_SIZE;
/// Most lines per copy launch (nouveau: 8191).
pub const COPY_MAX_LINES: u64 = 8191;

/// A pushbuffer segment under construction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushBuf {
    words: Vec<u32>,
}

impl PushBuf {
    /// An empty segment.
    pub fn new() -> PushBuf {
        PushBuf { words: Vec::new() }
    }

    /// The words so far.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Number of words.
    pub fn len(&self) -> usize {
        self.words.len()
    }

    /// True if no word was emitted.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Methods `mthd`, `mthd + 4`, ... with `data` on `subc` (incrementing headers, split at the
    /// 13-bit count limit).
    pub fn method(&mut self, subc: u32, mthd: u32, data: &[u32]) {
        let mut m = mthd;
        for chunk in data.chunks(method::MAX_COUNT as usize) {
            self.words.push(method::incr(subc, m, chunk.len() as u32));
            self.words.extend_from_slice(chunk);
            m += 4 * chunk.len() as u32;
        }
    }

    /// Every word of `data` to the same method `mthd` on `subc` (non-incrementing headers,
    /// nouveau `BEGIN_NIC0`), split at the 13-bit count limit.
    pub fn method_ni(&mut self, subc: u32, mthd: u32, data: &[u32]) {
        for chunk in data.chunks(method::MAX_COUNT as usize) {
            self.words
                .push(method::non_incr(subc, mthd, chunk.len() as u32));
            self.words.extend_from_slice(chunk);
        }
    }

    /// One method with a small value carried in the header (`BEGIN_IMC0`); falls back to an
    /// incrementing header for values that do not fit 13 bits.
    pub fn immediate(&mut self, subc: u32, mthd: u32, value: u32) {
        if value <= method::MAX_IMMEDIATE {
            self.words.push(method::immediate(subc, mthd, value));
        } else {
            self.method(subc, mthd, &[value]);
        }
    }

    /// SET_OBJECT: binds `class` on `engine` to `subc`.
    pub fn set_object(&mut self, subc: u32, class: u32, engine: u32) {
        self.method(subc, host::SET_OBJECT, &[host::set_object(class, engine)]);
    }

    /// A semaphore release of `payload` at `va` (`nvc0_fence_emit32`): 16 bytes with a timestamp
    /// when `long`, else 4 bytes; followed by NON_STALL_INTERRUPT when `interrupt` (nouveau's
    /// fence emits the same 5-method sequence).
    pub fn semaphore_release(&mut self, va: u64, payload: u32, long: bool, interrupt: bool) {
        let op = host::SEM_OP_RELEASE | if long { 0 } else { host::SEM_RELEASE_4BYTE };
        let hi = (va >> 32) as u32 & 0xff;
        let lo = va as u32;
        if interrupt {
            self.method(SUBC_HOST, host::SEMAPHORE_A, &[hi, lo, payload, op, 0]);
        } else {
            self.method(SUBC_HOST, host::SEMAPHORE_A, &[hi, lo, payload, op]);
        }
    }

    /// A semaphore acquire: waits until the value at `va` is >= `payload` (nouveau
    /// `nvc0_fence_sync32`: ACQUIRE_GEQUAL | YIELD).
    pub fn semaphore_acquire_geq(&mut self, va: u64, payload: u32) {
        let hi = (va >> 32) as u32 & 0xff;
        self.method(
            SUBC_HOST,
            host::SEMAPHORE_A,
            &[
                hi,
                va as u32,
                payload,
                host::SEM_OP_ACQ_GEQ | host::SEM_ACQUIRE_SWITCH,
            ],
        );
    }

    /// NON_STALL_INTERRUPT.
    pub fn non_stall_interrupt(&mut self) {
        self.method(SUBC_HOST, host::NON_STALL_INTERRUPT, &[0]);
    }

    /// Copies `len` bytes from `src` to `dst` (GPU VAs) with the copy class on [`SUBC_COPY`]:
    /// page-pitch multi-line launches for whole pages, one single-line launch for the rest.
    pub fn copy(&mut self, src: u64, dst: u64, len: u64) {
        let mut off = 0;
        while off < len {
            let rem = len - off;
            let (line, lines, multi) = if rem >= COPY_LINE {
                (COPY_LINE, (rem / COPY_LINE).min(COPY_MAX_LINES), true)
            } else {
                (rem, 1, false)
            };
            let (s, d) = (src + off, dst + off);
            self.method(
                SUBC_COPY,
                copy::OFFSET_IN_UPPER,
                &[
                    (s >> 32) as u32 & 0xff,
                    s as u32,
                    (d >> 32) as u32 & 0xff,
                    d as u32,
                    line as u32,
                    line as u32,
                    line as u32,
                    lines as u32,
                ],
            );
            let launch = copy::LAUNCH_TRANSFER_NON_PIPELINED
                | copy::LAUNCH_FLUSH_ENABLE
                | copy::LAUNCH_SRC_PITCH
                | copy::LAUNCH_DST_PITCH
                | if multi { copy::LAUNCH_MULTI_LINE } else { 0 };
            self.method(SUBC_COPY, copy::LAUNCH_DMA, &[launch]);
            off += line * lines;
        }
    }

    /// Launches a kernel of the MODEL compute class on [`SUBC_COMPUTE`]: KERNEL and ARG[0..n] in
    /// one incrementing header, then LAUNCH.
    pub fn kernel(&mut self, k: &Kernel) {
        let (args, used) = k.encode_args();
        let mut data = [0u32; compute::MAX_ARGS + 1];
        data[0] = k.id() as u32;
        data[1..=used].copy_from_slice(&args[..used]);
        self.method(SUBC_COMPUTE, compute::KERNEL, &data[..=used]);
        self.method(SUBC_COMPUTE, compute::LAUNCH, &[0]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use gf100::method::{Header, Mode};

    /// Decodes a pushbuffer into (subchannel, method, data) triples with the shared codec.
    fn decode(words: &[u32]) -> Vec<(u32, u32, u32)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < words.len() {
            match Header::decode(words[i]).unwrap() {
                Header::Methods {
                    mode,
                    subchannel,
                    method,
                    count,
                } => {
                    for k in 0..count {
                        let m = match mode {
                            Mode::Incrementing => method + 4 * k,
                            Mode::NonIncrementing => method,
                            Mode::IncrementOnce => method + if k == 0 { 0 } else { 4 },
                        };
                        out.push((subchannel, m, words[i + 1 + k as usize]));
                    }
                    i += 1 + count as usize;
                }
                Header::Immediate {
                    subchannel,
                    method,
                    data,
                } => {
                    out.push((subchannel, method, data));
                    i += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        out
    }

    #[test]
    fn fence_matches_nouveau_sequence() {
        let mut p = PushBuf::new();
        p.semaphore_release(0x12_3456_7890, 7, true, true);
        // BEGIN_NVC0(chan, 0, 0x10, 5) = 0x20050004.
        assert_eq!(p.words()[0], 0x2005_0004);
        assert_eq!(&p.words()[1..], &[0x12, 0x3456_7890, 7, 2, 0]);
        let mut p = PushBuf::new();
        p.semaphore_release(0x1000, 1, false, false);
        assert_eq!(
            decode(p.words()),
            vec![
                (0, 0x10, 0),
                (0, 0x14, 0x1000),
                (0, 0x18, 1),
                (0, 0x1c, 2 | 1 << 24)
            ]
        );
    }

    #[test]
    fn set_object_binds_class_and_engine() {
        let mut p = PushBuf::new();
        p.set_object(SUBC_COPY, copy::CLASS, host::ENGINE_PCOPY0);
        assert_eq!(decode(p.words()), vec![(4, 0, 0x4_90b5)]);
    }

    #[test]
    fn copy_splits_into_page_lines_and_tail() {
        let mut p = PushBuf::new();
        p.copy(0x10_0000_0000, 0x2000_0000, 3 * 4096 + 100);
        let m = decode(p.words());
        let launches: Vec<_> = m
            .iter()
            .filter(|(_, mt, _)| *mt == copy::LAUNCH_DMA)
            .collect();
        assert_eq!(launches.len(), 2);
        assert!(launches[0].2 & copy::LAUNCH_MULTI_LINE != 0);
        assert!(launches[1].2 & copy::LAUNCH_MULTI_LINE == 0);
        let get = |i: usize, mt: u32| m.iter().filter(|(_, x, _)| *x == mt).nth(i).unwrap().2;
        assert_eq!(get(0, copy::OFFSET_IN_UPPER), 0x10);
        assert_eq!(get(0, copy::LINE_COUNT), 3);
        assert_eq!(get(0, copy::LINE_LENGTH_IN), 4096);
        assert_eq!(get(1, copy::OFFSET_IN_LOWER), 3 * 4096);
        assert_eq!(get(1, copy::OFFSET_OUT_LOWER), 0x2000_0000 + 3 * 4096);
        assert_eq!(get(1, copy::LINE_LENGTH_IN), 100);
        assert_eq!(get(1, copy::LINE_COUNT), 1);
        assert!(m.iter().all(|(s, _, _)| *s == SUBC_COPY));
    }

    #[test]
    fn huge_copies_respect_line_limit() {
        let mut p = PushBuf::new();
        p.copy(0, 0x1000_0000, (COPY_MAX_LINES + 1) * COPY_LINE);
        let counts: Vec<u32> = decode(p.words())
            .into_iter()
            .filter(|(_, m, _)| *m == copy::LINE_COUNT)
            .map(|t| t.2)
            .collect();
        assert_eq!(counts, vec![COPY_MAX_LINES as u32, 1]);
    }

    #[test]
    fn kernel_launch_round_trips_through_the_model_decoder() {
        let k = Kernel::Mmul {
            a: 0x80_0000_0000,
            b: 0x80_0002_0000,
            c: 0x80_0004_0000,
            n: 64,
        };
        let mut p = PushBuf::new();
        p.kernel(&k);
        let m = decode(p.words());
        assert_eq!(
            m[0],
            (
                SUBC_COMPUTE,
                compute::KERNEL,
                compute::KernelId::Mmul as u32
            )
        );
        let mut args = [0u32; compute::MAX_ARGS];
        for (_, mt, d) in &m[1..m.len() - 1] {
            args[((mt - compute::ARG) / 4) as usize] = *d;
        }
        assert_eq!(Kernel::decode(m[0].2, &args), Ok(k));
        assert_eq!(m.last().unwrap().1, compute::LAUNCH);
    }

    #[test]
    fn long_method_lists_are_split() {
        let mut p = PushBuf::new();
        let data: Vec<u32> = (0..10_000).collect();
        p.method(2, 0, &data);
        let w = p.words();
        assert_eq!(w.len(), 10_002);
        assert_eq!(
            Header::decode(w[0]),
            Ok(Header::Methods {
                mode: Mode::Incrementing,
                subchannel: 2,
                method: 0,
                count: 8191
            })
        );
        assert!(matches!(
            Header::decode(w[8192]),
            Ok(Header::Methods { count: 1809, .. })
        ));
        p = PushBuf::new();
        p.method_ni(0, host::NOP, &[0; 9000]);
        let m = decode(p.words());
        assert_eq!(m.len(), 9000);
        assert!(m.iter().all(|&(s, mt, d)| (s, mt, d) == (0, host::NOP, 0)));
        p = PushBuf::new();
        p.immediate(1, 0x480, 5);
        p.immediate(1, 0x480, 1 << 20);
        assert_eq!(decode(p.words()), vec![(1, 0x480, 5), (1, 0x480, 1 << 20)]);
    }
}
