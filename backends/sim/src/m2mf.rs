//! The memory-to-memory format class 0x9039 (FERMI_MEMORY_TO_MEMORY_FORMAT_A) as PGRAPH runs it:
//! pitch-linear transfers between GPU virtual addresses, or from inline pushbuffer data
//! (LOAD_INLINE_DATA), with a semaphore release, an interrupt or a notifier afterwards.
//!
//! A memory-to-memory launch becomes the copy engine's [`Job::Copy`]: the same budgeted pieces,
//! the same launch-time scan and `CostModel::copy` duration, run by `engine` on PFIFO engine
//! PGRAPH in the context that launched it (faults: unit PGRAPH). An inline launch writes each
//! data word where it belongs as the word arrives (its cost is the pushbuffer fetch that carried
//! it); its completion actions run after the last byte.
//!
//! Executed: OFFSET_IN/OUT (+UPPER), PITCH_IN/OUT, LINE_LENGTH_IN, LINE_COUNT, LAUNCH_DMA with
//! pitch layouts (SRC_INLINE false or true), COMPLETION_TYPE flush-disable / flush-only /
//! release-semaphore (one- or four-word structure), INTERRUPT_TYPE none / interrupt (raised as
//! the non-stall interrupt of PGRAPH: MODEL), LOAD_INLINE_DATA, SET_SEMAPHORE_A/B/C,
//! SET_NOTIFY_A/B + NOTIFY; NO_OPERATION, WAIT_FOR_IDLE (the model's GR is idle between
//! methods), SEND_GO_IDLE, PM_TRIGGER and the SET_SPARE_NOOP methods do nothing, as on the
//! hardware (the SET_FALCON methods between them are refused); the block-linear geometry methods are stored (they matter only to block-linear
//! launches). Refused (the caller raises ILLEGAL_MTHD; nothing moves): block-linear layouts,
//! undefined field values, a transfer larger than [`MAX_COPY_BYTES`], a launch while an inline
//! transfer still waits for data, data with no inline transfer open, and every other method
//! (the MME macro methods, render-enable conditions, instrumentation).
//!
//! MODEL choices (cl9039.h does not say): each inline line starts with a fresh data word (the
//! unused bytes of a line's last word are dropped); NOTIFY writes a 16-byte notifier (64-bit
//! timestamp, then zeros) and type 1 (write-then-awaken) also raises the non-stall interrupt.

use gf100::m2mf as c;

use super::copy::{CopyDone, SemRelease, MAX_COPY_BYTES};
use super::engine::CopyPlan;

/// An inline transfer waiting for LOAD_INLINE_DATA words.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Inline {
    dst: u64,
    pitch: u64,
    line_len: u64,
    lines: u64,
    /// Current line and byte within it.
    line: u64,
    pos: u64,
    sem: Option<(u64, u32, bool)>,
    non_stall: bool,
}

/// M2MF method registers of one channel.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct M2mfRegs {
    offset_in: u64,
    offset_out: u64,
    pitch_in: u32,
    pitch_out: u32,
    line_length: u32,
    line_count: u32,
    sem_hi: u32,
    sem_lo: u32,
    sem_payload: u32,
    notify_hi: u32,
    notify_lo: u32,
    inline: Option<Inline>,
}

/// What a method asks of the PBDMA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Stored; nothing else happens.
    None,
    /// Run a memory-to-memory transfer, then its completion actions.
    Launch(CopyPlan, CopyDone),
    /// Write `bytes` at `va` (one inline data word); then, when `done` is given, the transfer
    /// is complete and its completion actions run.
    Write {
        va: u64,
        bytes: Vec<u8>,
        done: Option<CopyDone>,
    },
    /// An inline launch with nothing to transfer: its completion actions run now.
    Complete(CopyDone),
    /// Write the notifier at `va`; `awaken` raises the non-stall interrupt too.
    Notify { va: u64, awaken: bool },
}

/// A method the model refuses (the caller raises ILLEGAL_MTHD).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused;

fn va(hi: u32, lo: u32) -> u64 {
    ((hi & 0xff) as u64) << 32 | lo as u64
}

impl M2mfRegs {
    /// Checks restored state (`Channel::restore`): an open inline transfer must be inside its
    /// own bounds, as execution keeps it.
    pub(crate) fn check(&self) -> Result<(), String> {
        match self.inline {
            Some(t)
                if t.line_len == 0
                    || t.pos >= t.line_len
                    || t.line >= t.lines
                    || t.line_len.saturating_mul(t.lines) > MAX_COPY_BYTES =>
            {
                Err(format!("M2MF inline transfer out of bounds: {t:?}"))
            }
            _ => Ok(()),
        }
    }

    /// Executes one method of the class.
    pub(crate) fn method(&mut self, mthd: u32, data: u32) -> Result<Action, Refused> {
        let hi = |v: u64| (v & 0xffff_ffff) | ((data & 0xff) as u64) << 32;
        let lo = |v: u64| (v & !0xffff_ffff) | data as u64;
        match mthd {
            c::OFFSET_IN_UPPER => self.offset_in = hi(self.offset_in),
            c::OFFSET_IN => self.offset_in = lo(self.offset_in),
            c::OFFSET_OUT_UPPER => self.offset_out = hi(self.offset_out),
            c::OFFSET_OUT => self.offset_out = lo(self.offset_out),
            c::PITCH_IN => self.pitch_in = data,
            c::PITCH_OUT => self.pitch_out = data,
            c::LINE_LENGTH_IN => self.line_length = data,
            c::LINE_COUNT => self.line_count = data,
            c::SET_SEMAPHORE_A => self.sem_hi = data,
            c::SET_SEMAPHORE_B => self.sem_lo = data,
            c::SET_SEMAPHORE_C => self.sem_payload = data,
            c::SET_NOTIFY_A => self.notify_hi = data,
            c::SET_NOTIFY_B => self.notify_lo = data,
            c::NOTIFY => {
                if data > 1 {
                    return Err(Refused);
                }
                return Ok(Action::Notify {
                    va: va(self.notify_hi, self.notify_lo),
                    awaken: data == 1,
                });
            }
            c::LAUNCH_DMA => return self.launch(data),
            c::LOAD_INLINE_DATA => return self.data(data),
            c::NO_OPERATION
            | c::WAIT_FOR_IDLE
            | c::SEND_GO_IDLE
            | c::PM_TRIGGER
            | c::SPARE_NOOP11 => {}
            m if c::SPARE_NOOPS.contains(&m) => {}
            m if c::SRC_GEOMETRY.contains(&m)
                || c::DST_GEOMETRY.contains(&m)
                || c::ORIGINS.contains(&m) => {}
            _ => return Err(Refused),
        }
        Ok(Action::None)
    }

    /// Decodes the completion fields of LAUNCH_DMA.
    fn completion(&self, launch: u32) -> Result<CopyDone, Refused> {
        let sem = match c::launch_completion_type(launch) {
            0 | 1 => None,
            c::COMPLETION_RELEASE_SEMAPHORE => Some(SemRelease {
                va: va(self.sem_hi, self.sem_lo),
                payload: self.sem_payload,
                four_word: launch & c::LAUNCH_SEMAPHORE_ONE_WORD == 0,
            }),
            _ => return Err(Refused),
        };
        let non_stall = match c::launch_interrupt_type(launch) {
            0 => false,
            c::INTERRUPT_INTERRUPT => true,
            _ => return Err(Refused),
        };
        Ok(CopyDone { sem, non_stall })
    }

    fn launch(&mut self, launch: u32) -> Result<Action, Refused> {
        if self.inline.is_some() || launch & !c::LAUNCH_DEFINED != 0 {
            return Err(Refused);
        }
        let done = self.completion(launch)?;
        let inline = launch & c::LAUNCH_SRC_INLINE != 0;
        if launch & c::LAUNCH_DST_PITCH == 0 || (!inline && launch & c::LAUNCH_SRC_PITCH == 0) {
            return Err(Refused);
        }
        let (len, lines) = (self.line_length as u64, self.line_count as u64);
        if len * lines > MAX_COPY_BYTES {
            return Err(Refused);
        }
        if !inline {
            let job = CopyPlan {
                src: self.offset_in,
                dst: self.offset_out,
                pitch_in: self.pitch_in as u64,
                pitch_out: self.pitch_out as u64,
                len,
                lines: if len == 0 { 0 } else { lines },
            };
            return Ok(Action::Launch(job, done));
        }
        if len == 0 || lines == 0 {
            return Ok(Action::Complete(done));
        }
        self.inline = Some(Inline {
            dst: self.offset_out,
            pitch: self.pitch_out as u64,
            line_len: len,
            lines,
            line: 0,
            pos: 0,
            sem: done.sem.map(|s| (s.va, s.payload, s.four_word)),
            non_stall: done.non_stall,
        });
        Ok(Action::None)
    }

    fn data(&mut self, word: u32) -> Result<Action, Refused> {
        let Some(mut t) = self.inline else {
            return Err(Refused);
        };
        let n = (t.line_len - t.pos).min(4);
        let va = t
            .dst
            .wrapping_add(t.line.wrapping_mul(t.pitch))
            .wrapping_add(t.pos);
        let bytes = word.to_le_bytes()[..n as usize].to_vec();
        t.pos += n;
        if t.pos == t.line_len {
            t.pos = 0;
            t.line += 1;
        }
        let done = if t.line == t.lines {
            self.inline = None;
            Some(CopyDone {
                sem: t.sem.map(|(va, payload, four_word)| SemRelease {
                    va,
                    payload,
                    four_word,
                }),
                non_stall: t.non_stall,
            })
        } else {
            self.inline = Some(t);
            None
        };
        Ok(Action::Write { va, bytes, done })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nouveau's `nvc0_bo_move_m2mf` launch: pitch in and out, FLUSH_DISABLE, no interrupt,
    /// one-word semaphore size.
    const NOUVEAU_LAUNCH: u32 = c::LAUNCH_SRC_PITCH | c::LAUNCH_DST_PITCH | 1 << 20;

    fn set(r: &mut M2mfRegs, pairs: &[(u32, u32)]) {
        for &(m, d) in pairs {
            assert_eq!(r.method(m, d), Ok(Action::None), "method {m:#x}");
        }
    }

    #[test]
    fn nouveau_buffer_move_becomes_a_copy_job() {
        let mut r = M2mfRegs::default();
        set(
            &mut r,
            &[
                (c::OFFSET_OUT_UPPER, 0x1),
                (c::OFFSET_OUT, 0x2000_0000),
                (c::OFFSET_IN_UPPER, 0x0),
                (c::OFFSET_IN, 0x10_0000),
                (c::PITCH_IN, 4096),
                (c::PITCH_OUT, 4096),
                (c::LINE_LENGTH_IN, 4096),
                (c::LINE_COUNT, 2047),
            ],
        );
        let Ok(Action::Launch(job, done)) = r.method(c::LAUNCH_DMA, NOUVEAU_LAUNCH) else {
            panic!("no launch");
        };
        assert_eq!(
            job,
            CopyPlan {
                src: 0x10_0000,
                dst: 0x1_2000_0000,
                pitch_in: 4096,
                pitch_out: 4096,
                len: 4096,
                lines: 2047
            }
        );
        assert_eq!(
            done,
            CopyDone {
                sem: None,
                non_stall: false
            }
        );
    }

    #[test]
    fn semaphore_and_interrupt_completion() {
        let mut r = M2mfRegs::default();
        set(
            &mut r,
            &[
                (c::SET_SEMAPHORE_A, 0x2),
                (c::SET_SEMAPHORE_B, 0x40),
                (c::SET_SEMAPHORE_C, 0xcafe),
            ],
        );
        let launch = NOUVEAU_LAUNCH | 2 << 12 | 1 << 16;
        let Ok(Action::Launch(_, done)) = r.method(c::LAUNCH_DMA, launch) else {
            panic!("no launch");
        };
        assert_eq!(
            done.sem,
            Some(SemRelease {
                va: 0x2_0000_0040,
                payload: 0xcafe,
                four_word: false
            })
        );
        assert!(done.non_stall);
        // Four-word structure when bit 20 is clear.
        let Ok(Action::Launch(_, done)) = r.method(c::LAUNCH_DMA, launch & !(1 << 20)) else {
            panic!("no launch");
        };
        assert!(done.sem.is_some_and(|s| s.four_word));
    }

    #[test]
    fn undefined_and_block_linear_launches_are_refused() {
        let mut r = M2mfRegs::default();
        for bad in [
            c::LAUNCH_DST_PITCH,           // block-linear source
            c::LAUNCH_SRC_PITCH,           // block-linear destination
            NOUVEAU_LAUNCH | 3 << 12,      // completion type 3
            NOUVEAU_LAUNCH | 2 << 16,      // interrupt type 2
            NOUVEAU_LAUNCH | 1 << 2,       // an undefined bit
            c::LAUNCH_SRC_INLINE | 1 << 4, // inline into block linear
        ] {
            assert_eq!(r.method(c::LAUNCH_DMA, bad), Err(Refused), "{bad:#x}");
        }
        set(
            &mut r,
            &[(c::LINE_LENGTH_IN, 1 << 20), (c::LINE_COUNT, 1 << 12)],
        );
        assert_eq!(
            r.method(c::LAUNCH_DMA, NOUVEAU_LAUNCH),
            Err(Refused),
            "4 GiB"
        );
        // Unknown methods (an MME macro, render enable) and stray data are refused.
        assert_eq!(r.method(0x3800, 0), Err(Refused));
        assert_eq!(r.method(0x338, 0), Err(Refused));
        assert_eq!(r.method(0x27c, 0), Err(Refused), "SET_FALCON00");
        assert_eq!(r.method(0x2fc, 0), Ok(Action::None), "SET_SPARE_NOOP11");
        assert_eq!(r.method(c::LOAD_INLINE_DATA, 0), Err(Refused));
        assert_eq!(r.method(c::NOTIFY, 2), Err(Refused));
    }

    #[test]
    fn inline_data_fills_lines_then_completes() {
        let mut r = M2mfRegs::default();
        set(
            &mut r,
            &[
                (c::OFFSET_OUT, 0x1000),
                (c::PITCH_OUT, 0x100),
                (c::LINE_LENGTH_IN, 6),
                (c::LINE_COUNT, 2),
                (c::SET_SEMAPHORE_B, 0x80),
                (c::SET_SEMAPHORE_C, 9),
            ],
        );
        let launch = c::LAUNCH_SRC_INLINE | c::LAUNCH_DST_PITCH | 2 << 12 | 1 << 20;
        assert_eq!(r.method(c::LAUNCH_DMA, launch), Ok(Action::None));
        // A second launch while data is awaited is refused.
        assert_eq!(r.method(c::LAUNCH_DMA, launch), Err(Refused));
        let w = |r: &mut M2mfRegs, v| r.method(c::LOAD_INLINE_DATA, v).unwrap();
        let expect = |va, bytes: &[u8]| Action::Write {
            va,
            bytes: bytes.to_vec(),
            done: None,
        };
        assert_eq!(w(&mut r, 0x0403_0201), expect(0x1000, &[1, 2, 3, 4]));
        assert_eq!(w(&mut r, 0x0807_0605), expect(0x1004, &[5, 6]));
        assert_eq!(w(&mut r, 0x0c0b_0a09), expect(0x1100, &[9, 10, 11, 12]));
        let Action::Write { va, bytes, done } = w(&mut r, 0x100f_0e0d) else {
            panic!("no write");
        };
        assert_eq!((va, bytes), (0x1104, vec![13, 14]));
        assert_eq!(
            done.and_then(|d| d.sem).map(|s| (s.va, s.payload)),
            Some((0x80, 9))
        );
        // The transfer is closed: more data is refused.
        assert_eq!(r.method(c::LOAD_INLINE_DATA, 0), Err(Refused));
    }

    #[test]
    fn restored_inline_state_is_checked() {
        let mut r = M2mfRegs::default();
        assert!(r.check().is_ok());
        set(&mut r, &[(c::LINE_LENGTH_IN, 8), (c::LINE_COUNT, 2)]);
        let launch = c::LAUNCH_SRC_INLINE | c::LAUNCH_DST_PITCH;
        assert_eq!(r.method(c::LAUNCH_DMA, launch), Ok(Action::None));
        assert!(r.check().is_ok());
        let mut bad = r;
        if let Some(t) = bad.inline.as_mut() {
            t.pos = 8;
        }
        assert!(bad.check().is_err(), "a position past its line");
    }

    #[test]
    fn notify_uses_the_notifier_address() {
        let mut r = M2mfRegs::default();
        set(&mut r, &[(c::SET_NOTIFY_A, 0x1), (c::SET_NOTIFY_B, 0x300)]);
        assert_eq!(
            r.method(c::NOTIFY, 1),
            Ok(Action::Notify {
                va: 0x1_0000_0300,
                awaken: true
            })
        );
    }
}
