//! The command scanner of the submission path (GVT-g's `cmd_parser.c` in spirit, far smaller):
//! before a submission is dispatched, the new GPFIFO entries and the pushbuffer segments they
//! point at are decoded looking for host method MEM_OP_B with operation MMU_TLB_INVALIDATE, a TLB
//! invalidate issued from the command stream rather than through the register (DESIGN §5: "the
//! submission path must see them"). Each one found becomes a guest TLB flush of the shadow page
//! tables before the GPU runs the work.
//!
//! The scanner only reads: memory is reached through a caller-supplied reader (the shadow
//! translation of the channel's address space) and every loop is bounded by a [`Budget`]. An
//! unmapped entry or segment stops the scan (the GPU will fault there itself); so does an illegal
//! method header. The decoder follows `gf100::method::Header` exactly as PBDMA does, including
//! method runs that continue into the next segment (the run state is kept per channel in
//! [`ScanState`]).
//!
//! What the scan cannot see, by design: work that changes a page table *on the GPU* (a copy or
//! kernel writing PTEs) followed by an invalidate — the shadow is rebuilt when the submission is
//! dispatched, before that GPU write happens, and stays stale until the next flush. A stale
//! shadow only ever maps the VM's own memory (every shadow entry was validated), so this costs the
//! guest correctness, never isolation; GPUvm has the same limit.

use gf100::gpfifo::{self, GpEntry};
use gf100::method::{Header, Mode, MAX_METHOD};
use gf100::{host, Target};

/// How much one scan may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// GPFIFO entries.
    pub entries: u64,
    /// Pushbuffer dwords.
    pub dwords: u64,
}

impl Budget {
    /// The budget of one dispatch: 1024 entries (nouveau's ring size) and 256 Ki dwords (1 MiB).
    pub const DEFAULT: Budget = Budget {
        entries: 1024,
        dwords: 256 << 10,
    };
}

/// Why a scan ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Every new entry was scanned.
    Done,
    /// An entry or pushbuffer word is not mapped (the GPU will fault on it).
    Unreadable,
    /// The budget ran out; later invalidates in this submission are not seen.
    Budget,
    /// An illegal method header (the GPU stops the channel there).
    IllegalHeader,
    /// GP_PUT is beyond the ring (the GPU reports IB_PUT_OVERFLOW).
    PutBeyondRing,
}

/// The GPFIFO ring of a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ring {
    /// GPU VA of entry 0.
    pub base: u64,
    /// log2 of the number of entries (RAMFC IB_CONFIG; clamped to 32 as the hardware field).
    pub order: u32,
}

impl Ring {
    /// Number of entries.
    pub fn entries(&self) -> u64 {
        1u64 << self.order.min(32)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    mode: Mode,
    method: u32,
    remaining: u32,
}

/// Decoder state carried from one submission of a channel to the next.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanState {
    mem_op_a: u32,
    run: Option<Run>,
}

/// [`ScanState`] as plain numbers, for a snapshot: `run` is (mode 0 incrementing / 1
/// non-incrementing / 2 increment-once, byte method, data words remaining).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ScanParts {
    /// The last MEM_OP_A value.
    pub mem_op_a: u32,
    /// A method run continuing into the next submission.
    pub run: Option<(u8, u32, u32)>,
}

impl ScanState {
    /// The state as plain numbers.
    pub fn parts(&self) -> ScanParts {
        ScanParts {
            mem_op_a: self.mem_op_a,
            run: self.run.map(|r| {
                let mode = match r.mode {
                    Mode::Incrementing => 0,
                    Mode::NonIncrementing => 1,
                    Mode::IncrementOnce => 2,
                };
                (mode, r.method, r.remaining)
            }),
        }
    }

    /// The state from plain numbers (untrusted: a run must have words remaining, a known
    /// mode and a method in range).
    pub fn from_parts(p: ScanParts) -> Option<ScanState> {
        let run = match p.run {
            None => None,
            Some((mode, method, remaining)) => {
                let mode = match mode {
                    0 => Mode::Incrementing,
                    1 => Mode::NonIncrementing,
                    2 => Mode::IncrementOnce,
                    _ => return None,
                };
                if remaining == 0 || method > MAX_METHOD || method % 4 != 0 {
                    return None;
                }
                Some(Run {
                    mode,
                    method,
                    remaining,
                })
            }
        };
        Some(ScanState {
            mem_op_a: p.mem_op_a,
            run,
        })
    }
}

/// What a scan found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanOutcome {
    /// TLB invalidates in command order: `Some((page directory, target))` for one address space,
    /// `None` for all of them.
    pub flushes: Vec<Option<(u64, Target)>>,
    /// GPFIFO entries scanned.
    pub entries: u64,
    /// Pushbuffer dwords scanned.
    pub dwords: u64,
    /// Why the scan ended.
    pub stop: Stop,
}

/// Reads `buf.len()` bytes at GPU VA `va` (never crossing a 4 KiB page); false if unmapped.
pub type Reader<'a> = dyn FnMut(u64, &mut [u8]) -> bool + 'a;

fn read_va(read: &mut Reader, va: u64, buf: &mut [u8]) -> bool {
    let mut done = 0usize;
    while done < buf.len() {
        let a = va.wrapping_add(done as u64);
        let in_page = (gf100::PAGE_SIZE - (a & (gf100::PAGE_SIZE - 1))) as usize;
        let n = in_page.min(buf.len() - done);
        if !read(a, &mut buf[done..done + n]) {
            return false;
        }
        done += n;
    }
    true
}

/// Scans the GPFIFO entries `[from, to)` (ring order) of `ring`.
pub fn scan(
    read: &mut Reader,
    ring: Ring,
    from: u32,
    to: u32,
    st: &mut ScanState,
    budget: Budget,
) -> ScanOutcome {
    let mut out = ScanOutcome {
        flushes: Vec::new(),
        entries: 0,
        dwords: 0,
        stop: Stop::Done,
    };
    let n_entries = ring.entries();
    if u64::from(to) >= n_entries {
        out.stop = Stop::PutBeyondRing;
        return out;
    }
    let from = u64::from(from) % n_entries;
    let count = (u64::from(to) + n_entries - from) % n_entries;
    for i in 0..count {
        if out.entries >= budget.entries {
            out.stop = Stop::Budget;
            return out;
        }
        out.entries += 1;
        let idx = (from + i) % n_entries;
        let mut raw = [0u8; gpfifo::ENTRY_SIZE as usize];
        let entry_va = ring.base.wrapping_add(idx * gpfifo::ENTRY_SIZE);
        if !read_va(read, entry_va, &mut raw) {
            out.stop = Stop::Unreadable;
            return out;
        }
        let Ok(entry) = GpEntry::decode(u64::from_le_bytes(raw)) else {
            // A zero-length entry: the GPU reports IB_ENTRY_INVALID and moves past it.
            continue;
        };
        if let Some(stop) = segment(read, entry, st, budget, &mut out) {
            out.stop = stop;
            return out;
        }
    }
    out
}

/// Scans one pushbuffer segment; `Some` ends the whole scan.
fn segment(
    read: &mut Reader,
    entry: GpEntry,
    st: &mut ScanState,
    budget: Budget,
    out: &mut ScanOutcome,
) -> Option<Stop> {
    let mut va = entry.va;
    let mut left = u64::from(entry.length_dwords);
    let mut buf = Vec::new();
    while left > 0 {
        if out.dwords >= budget.dwords {
            return Some(Stop::Budget);
        }
        let in_page = (gf100::PAGE_SIZE - (va & (gf100::PAGE_SIZE - 1))) / 4;
        let n = in_page.max(1).min(left).min(budget.dwords - out.dwords);
        buf.resize(n as usize * 4, 0);
        if !read_va(read, va, &mut buf) {
            return Some(Stop::Unreadable);
        }
        out.dwords += n;
        for w in buf.chunks_exact(4) {
            match word(u32::from_le_bytes([w[0], w[1], w[2], w[3]]), st, out) {
                Word::Continue => {}
                Word::EndSegment => return None,
                Word::Illegal => return Some(Stop::IllegalHeader),
            }
        }
        va = va.wrapping_add(n * 4);
        left -= n;
    }
    None
}

enum Word {
    Continue,
    EndSegment,
    Illegal,
}

/// Feeds one pushbuffer dword to the decoder.
fn word(w: u32, st: &mut ScanState, out: &mut ScanOutcome) -> Word {
    if let Some(run) = st.run.as_mut() {
        let m = run.method;
        run.remaining -= 1;
        match run.mode {
            Mode::Incrementing => run.method = (run.method + 4) & MAX_METHOD,
            Mode::IncrementOnce => {
                run.method = (run.method + 4) & MAX_METHOD;
                run.mode = Mode::NonIncrementing;
            }
            Mode::NonIncrementing => {}
        }
        if run.remaining == 0 {
            st.run = None;
        }
        method(m, w, st, out);
        return Word::Continue;
    }
    match Header::decode(w) {
        Ok(Header::Methods {
            mode,
            method: m,
            count,
            ..
        }) => {
            if count > 0 {
                st.run = Some(Run {
                    mode,
                    method: m,
                    remaining: count,
                });
            }
            Word::Continue
        }
        Ok(Header::Immediate {
            method: m, data, ..
        }) => {
            method(m, data, st, out);
            Word::Continue
        }
        Ok(Header::SubDeviceMask) => Word::Continue,
        Ok(Header::EndSegment) => Word::EndSegment,
        Err(_) => Word::Illegal,
    }
}

/// One method: host methods are valid on every subchannel.
fn method(m: u32, data: u32, st: &mut ScanState, out: &mut ScanOutcome) {
    match m {
        host::MEM_OP_A => st.mem_op_a = data,
        host::MEM_OP_B if host::mem_op_b_operation(data) == host::MEM_OP_MMU_TLB_INVALIDATE => {
            let one = match host::mem_op_a_decode(st.mem_op_a) {
                Some(pd) if data & host::MEM_OP_TLB_PDB_ALL == 0 => Some(pd),
                _ => None,
            };
            out.flushes.push(one);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gf100::method;
    use std::collections::HashMap;

    /// A sparse GPU address space of 4 KiB pages.
    #[derive(Default)]
    struct Space(HashMap<u64, Vec<u8>>);

    impl Space {
        fn write(&mut self, va: u64, bytes: &[u8]) {
            for (i, b) in bytes.iter().enumerate() {
                let a = va + i as u64;
                self.0.entry(a >> 12).or_insert_with(|| vec![0; 4096])[(a & 0xfff) as usize] = *b;
            }
        }
        fn words(&mut self, va: u64, w: &[u32]) {
            let b: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
            self.write(va, &b);
        }
        fn reader(&self) -> impl FnMut(u64, &mut [u8]) -> bool + '_ {
            |va, buf| match self.0.get(&(va >> 12)) {
                Some(p) => {
                    let o = (va & 0xfff) as usize;
                    buf.copy_from_slice(&p[o..o + buf.len()]);
                    true
                }
                None => false,
            }
        }
    }

    const RING: Ring = Ring {
        base: 0x10_0000,
        order: 3,
    };

    fn entry(s: &mut Space, idx: u64, va: u64, dwords: u32) {
        s.write(
            RING.base + idx * 8,
            &GpEntry::new(va, dwords).encode().to_le_bytes(),
        );
    }

    fn invalidate(pd: u64, all: bool) -> [u32; 3] {
        [
            method::incr(0, host::MEM_OP_A, 2),
            host::mem_op_a(pd, Target::Vram),
            host::mem_op_b_tlb_invalidate(all),
        ]
    }

    #[test]
    fn finds_invalidates_in_entry_order_across_the_ring_wrap() {
        let mut s = Space::default();
        let a = invalidate(0x5_0000, false);
        s.words(0x20_0000, &[method::incr(0, host::NOP, 1), 0]);
        s.words(0x20_0008, &a);
        entry(&mut s, 7, 0x20_0000, 5);
        let b = [
            method::immediate(3, host::MEM_OP_A, 0),
            method::incr(0, host::MEM_OP_B, 1),
            host::mem_op_b_tlb_invalidate(true),
        ];
        s.words(0x30_0000, &b);
        entry(&mut s, 0, 0x30_0000, 3);
        let mut st = ScanState::default();
        let out = scan(&mut s.reader(), RING, 7, 1, &mut st, Budget::DEFAULT);
        assert_eq!(out.stop, Stop::Done);
        assert_eq!(out.entries, 2);
        assert_eq!(out.dwords, 8);
        assert_eq!(out.flushes, vec![Some((0x5_0000, Target::Vram)), None]);
    }

    #[test]
    fn a_method_run_continues_into_the_next_segment() {
        let mut s = Space::default();
        s.words(0x20_0000, &[method::incr(0, host::MEM_OP_A, 2), 0x40]);
        s.words(0x20_1000, &[host::mem_op_b_tlb_invalidate(false)]);
        entry(&mut s, 0, 0x20_0000, 2);
        entry(&mut s, 1, 0x20_1000, 1);
        let mut st = ScanState::default();
        let out = scan(&mut s.reader(), RING, 0, 2, &mut st, Budget::DEFAULT);
        assert_eq!(out.flushes, vec![Some((0x40 << 10, Target::Vram))]);
        // Non-incrementing runs and other MEM_OP operations are not invalidates.
        s.words(
            0x20_2000,
            &[
                method::non_incr(0, host::MEM_OP_B, 2),
                host::MEM_OP_SOFT_FLUSH << 27,
                host::mem_op_b_tlb_invalidate(true),
            ],
        );
        entry(&mut s, 2, 0x20_2000, 3);
        let out = scan(&mut s.reader(), RING, 2, 3, &mut st, Budget::DEFAULT);
        assert_eq!(out.flushes, vec![None]);
    }

    #[test]
    fn unmapped_illegal_budget_and_bad_put_stop_the_scan() {
        let mut s = Space::default();
        entry(&mut s, 0, 0x7000_0000, 4);
        let mut st = ScanState::default();
        let out = scan(&mut s.reader(), RING, 0, 1, &mut st, Budget::DEFAULT);
        assert_eq!(out.stop, Stop::Unreadable);
        let out = scan(&mut s.reader(), RING, 0, 8, &mut st, Budget::DEFAULT);
        assert_eq!(out.stop, Stop::PutBeyondRing);
        s.words(0x20_0000, &[6 << 29, host::mem_op_b_tlb_invalidate(true)]);
        entry(&mut s, 2, 0x20_0000, 2);
        let out = scan(&mut s.reader(), RING, 2, 3, &mut st, Budget::DEFAULT);
        assert_eq!(out.stop, Stop::IllegalHeader);
        assert!(out.flushes.is_empty());
        // A huge segment is cut by the dword budget; a zero-length entry is skipped.
        s.words(0x40_0000, &[0; 2048]);
        entry(&mut s, 3, 0x40_0000, 2048);
        s.write(RING.base + 4 * 8, &0u64.to_le_bytes());
        let small = Budget {
            entries: 8,
            dwords: 100,
        };
        let out = scan(&mut s.reader(), RING, 3, 5, &mut st, small);
        assert_eq!((out.stop, out.dwords), (Stop::Budget, 100));
        let out = scan(
            &mut s.reader(),
            RING,
            4,
            5,
            &mut st,
            Budget {
                entries: 0,
                dwords: 0,
            },
        );
        assert_eq!(out.stop, Stop::Budget);
        let out = scan(&mut s.reader(), RING, 4, 5, &mut st, small);
        assert_eq!((out.stop, out.entries), (Stop::Done, 1));
    }

    #[test]
    fn end_of_segment_ends_only_that_segment() {
        let mut s = Space::default();
        let a = invalidate(0x9000, false);
        s.words(0x20_0000, &[7 << 29, a[0], a[1], a[2]]);
        s.words(0x20_1000, &a);
        entry(&mut s, 0, 0x20_0000, 4);
        entry(&mut s, 1, 0x20_1000, 3);
        let mut st = ScanState::default();
        let out = scan(&mut s.reader(), RING, 0, 2, &mut st, Budget::DEFAULT);
        assert_eq!(out.flushes, vec![Some((0x9000, Target::Vram))]);
    }
}
