//! The copy engine, class 0x90B5 (GF100_DMA_COPY) as run by PCOPY0: pitch-linear copies between
//! GPU virtual addresses, with an optional semaphore release and non-stall interrupt when the copy
//! completes.
//!
//! Modelled: OFFSET_IN/OUT, PITCH_IN/OUT, LINE_LENGTH_IN, LINE_COUNT, SET_SEMAPHORE_A/B/PAYLOAD
//! and LAUNCH_DMA with pitch layouts on both sides, single or multi-line, DATA_TRANSFER_TYPE none
//! / pipelined / non-pipelined (the same here), SEMAPHORE_TYPE none / one-word / four-word,
//! INTERRUPT_TYPE none / non-blocking. Rejected with PBDMA ILLEGAL_MTHD (nothing is copied):
//! block-linear layouts, REMAP, the blocking interrupt, reserved field values, and copies larger
//! than [`MAX_COPY_BYTES`]. Data moves in 64 KiB pieces of a line (contiguous lines joined into
//! one, `CopyPlan::job`) over the copy's modeled duration, page by page through
//! the MMU of the context that launched it (`engine`); a fault stops the copy where it happened
//! (MMU fault unit PCOPY0, client PCOPY0), reported when that piece is reached.

use gf100::copy as c;

pub(crate) use super::completion::{CopyDone, SemRelease};
use super::engine::{CopyPlan, Job};

/// Largest number of bytes one LAUNCH_DMA may move (MODEL limit: bounds the simulator's work
/// per method; nouveau splits large copies into lines of at most 128 KiB anyway).
pub(crate) const MAX_COPY_BYTES: u64 = 1 << 30;

/// Copy-engine method registers of one channel.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct CopyRegs {
    offset_in: u64,
    offset_out: u64,
    pitch_in: u32,
    pitch_out: u32,
    line_length: u32,
    line_count: u32,
    sem_hi: u32,
    sem_lo: u32,
    sem_payload: u32,
}

/// Why a launch failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyError {
    /// Unsupported or reserved LAUNCH_DMA settings, or too large: PBDMA ILLEGAL_MTHD.
    Illegal,
}

/// A method the copy class does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UnknownMethod;

impl CopyRegs {
    /// Stores a method; returns `Ok(true)` for LAUNCH_DMA (the caller then calls [`plan`]).
    pub(crate) fn method(&mut self, mthd: u32, data: u32) -> Result<bool, UnknownMethod> {
        let hi = |v: u64| (v & 0xffff_ffff) | ((data & 0xff) as u64) << 32;
        let lo = |v: u64| (v & !0xffff_ffff) | data as u64;
        match mthd {
            c::OFFSET_IN_UPPER => self.offset_in = hi(self.offset_in),
            c::OFFSET_IN_LOWER => self.offset_in = lo(self.offset_in),
            c::OFFSET_OUT_UPPER => self.offset_out = hi(self.offset_out),
            c::OFFSET_OUT_LOWER => self.offset_out = lo(self.offset_out),
            c::PITCH_IN => self.pitch_in = data,
            c::PITCH_OUT => self.pitch_out = data,
            c::LINE_LENGTH_IN => self.line_length = data,
            c::LINE_COUNT => self.line_count = data,
            c::SET_SEMAPHORE_A => self.sem_hi = data,
            c::SET_SEMAPHORE_B => self.sem_lo = data,
            c::SET_SEMAPHORE_PAYLOAD => self.sem_payload = data,
            c::LAUNCH_DMA => return Ok(true),
            _ => return Err(UnknownMethod),
        }
        Ok(false)
    }

    /// Decodes LAUNCH_DMA: what to do on completion, or `Illegal`.
    fn completion(&self, launch: u32) -> Result<CopyDone, CopyError> {
        let four_word = match c::launch_semaphore_type(launch) {
            0 => None,
            1 => Some(false),
            2 => Some(true),
            _ => return Err(CopyError::Illegal),
        };
        let non_stall = match c::launch_interrupt_type(launch) {
            0 => false,
            2 => true,
            _ => return Err(CopyError::Illegal),
        };
        let va = ((self.sem_hi & 0xff) as u64) << 32 | self.sem_lo as u64;
        let sem = four_word.map(|four_word| SemRelease {
            va,
            payload: self.sem_payload,
            four_word,
        });
        Ok(CopyDone { sem, non_stall })
    }
}

/// Decodes LAUNCH_DMA: the copy to run over its duration and its completion actions. Nothing is
/// read or written here; an illegal launch moves nothing.
pub(crate) fn plan(regs: &CopyRegs, launch: u32) -> Result<(Job, CopyDone), CopyError> {
    let done = regs.completion(launch)?;
    let transfer = c::launch_transfer_type(launch);
    if transfer == 3 || launch & c::LAUNCH_REMAP != 0 {
        return Err(CopyError::Illegal);
    }
    let mut lines = 0;
    if transfer != 0 {
        let pitch = c::LAUNCH_SRC_PITCH | c::LAUNCH_DST_PITCH;
        if launch & pitch != pitch {
            return Err(CopyError::Illegal);
        }
        lines = if launch & c::LAUNCH_MULTI_LINE != 0 {
            regs.line_count as u64
        } else {
            1
        };
        if regs.line_length as u64 * lines > MAX_COPY_BYTES {
            return Err(CopyError::Illegal);
        }
    }
    if regs.line_length == 0 {
        lines = 0;
    }
    let job = CopyPlan {
        src: regs.offset_in,
        dst: regs.offset_out,
        pitch_in: regs.pitch_in as u64,
        pitch_out: regs.pitch_out as u64,
        len: regs.line_length as u64,
        lines,
    }
    .job();
    Ok((job, done))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_stored_and_unknown_ones_rejected() {
        let mut r = CopyRegs::default();
        assert_eq!(r.method(c::OFFSET_IN_UPPER, 0x1ff), Ok(false));
        assert_eq!(r.method(c::OFFSET_IN_LOWER, 0x1000), Ok(false));
        assert_eq!(r.offset_in, 0xff_0000_1000);
        assert_eq!(r.method(c::LAUNCH_DMA, 0), Ok(true));
        assert_eq!(r.method(0x500, 0), Err(UnknownMethod));
    }

    #[test]
    fn launch_fields_are_validated() {
        let r = CopyRegs {
            sem_hi: 1,
            sem_lo: 0x20,
            sem_payload: 7,
            ..CopyRegs::default()
        };
        let d = r.completion(c::LAUNCH_SEMAPHORE_FOUR_WORD | c::LAUNCH_INTERRUPT_NON_BLOCKING);
        assert_eq!(
            d,
            Ok(CopyDone {
                sem: Some(SemRelease {
                    va: 0x1_0000_0020,
                    payload: 7,
                    four_word: true
                }),
                non_stall: true
            })
        );
        assert_eq!(r.completion(3 << 3), Err(CopyError::Illegal));
        assert_eq!(
            r.completion(c::LAUNCH_INTERRUPT_BLOCKING),
            Err(CopyError::Illegal)
        );
    }

    #[test]
    fn contiguous_lines_that_do_not_overlap_move_as_one() {
        let page = 4096;
        let lines = |src, dst, pitch_in, pitch_out, len, lines| {
            let plan = CopyPlan {
                src,
                dst,
                pitch_in,
                pitch_out,
                len,
                lines,
            };
            match plan.job() {
                Job::Copy(p) => (p.len, p.lines),
                _ => unreachable!("a copy"),
            }
        };
        // Page-long lines back to back on both sides, apart: one 64 KiB line.
        assert_eq!(lines(0, 1 << 20, page, page, page, 16), (16 * page, 1));
        // Overlapping ranges keep their lines (each read before it is written).
        assert_eq!(lines(0, page, page, page, page, 16), (page, 16));
        assert_eq!(lines(page, 0, page, page, page, 16), (page, 16));
        // A pitch that skips bytes on either side keeps its lines.
        assert_eq!(lines(0, 1 << 20, 2 * page, page, page, 4), (page, 4));
        assert_eq!(lines(0, 1 << 20, page, 2 * page, page, 4), (page, 4));
        // One line, no line, and ranges at the top of the address space stay as they are.
        assert_eq!(lines(0, 1 << 20, page, page, page, 1), (page, 1));
        assert_eq!(lines(0, 1 << 20, 0, 0, 0, 0), (0, 0));
        assert_eq!(lines(u64::MAX - page, 0, page, page, page, 2), (page, 2));
    }
}
