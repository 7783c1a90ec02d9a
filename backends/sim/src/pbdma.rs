//! The PBDMA ("pusher"): runs one channel's command stream. It fetches GPFIFO entries from the
//! ring at IB base + GP_GET * 8 through the channel's VM, decodes the pushbuffer segment each
//! entry points at (`gf100::method::Header`), executes host methods (class 0x906f, below 0x100:
//! object binding, semaphores, non-stall interrupt, reference, MEM_OP TLB invalidate) and hands
//! class methods to the engine bound on the subchannel (copy 0x90b5; PGRAPH's compute 0x90c0 and
//! memory-to-memory format 0x9039). A class the model does not execute cannot be bound: its
//! SET_OBJECT, and any method on a subchannel with no object, stops the channel with
//! ILLEGAL_MTHD.
//!
//! The model has one PBDMA (PBDMA 0) that every channel uses in turn. Errors stop the channel
//! (STATE RUNNABLE cleared) and are reported on PBDMA 0 with the offending method in
//! METHOD0/DATA0; MMU faults of the fetch and of host semaphores are reported for unit PFIFO.
//! What a stopped channel resumes with once re-enabled: a fetch fault (GPFIFO entry or pushbuffer
//! word) is retried; a faulting or illegal method, a zero-length GPFIFO entry and an illegal
//! header are skipped.

use gf100::fault::{self, FaultFlags};
use gf100::gpfifo::GpEntry;
use gf100::method::{Header, Mode};
use gf100::{host, pfifo, userd, Target};

use super::channel::{Acquire, Channel, ChannelCtx, EngineClass, MethodRun, Segment};
use super::copy::{self, CopyError};
use super::engine::EngineOp;
use super::intr::{FaultReport, PbdmaError};
use super::m2mf::Action;
use super::mmu::{page_piece, VaFault, Vspace};
use super::regs::TlbFlush;
use super::Core;

/// Work that keeps the GPU busy past the current time, and what to do when it ends.
#[derive(Debug)]
pub(crate) enum Work {
    /// Fetching a GPFIFO entry and its pushbuffer.
    Fetch,
    /// Restoring a channel switched out mid-entry (`CostModel::ctxsw_ns`).
    Restore,
    /// A copy or a compute kernel, running in the context it captured at launch.
    Engine(Box<EngineOp>),
}

/// Why a channel's turn ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The channel occupies the GPU for `duration` ns fetching an entry; it continues
    /// afterwards.
    Fetch {
        /// Modeled duration.
        duration: u64,
    },
    /// The channel occupies the GPU for `duration` ns restoring its context after a preempt
    /// switched it out mid-entry; it continues afterwards.
    Restore {
        /// Modeled duration.
        duration: u64,
    },
    /// The channel launched an engine operation; it continues once the operation has ended.
    Launch(Box<EngineOp>),
    /// A GPFIFO entry was completed (a switch point).
    EntryDone,
    /// GP_GET reached GP_PUT.
    Idle,
    /// Waiting on a semaphore acquire.
    Blocked,
    /// An error stopped the channel.
    Stopped,
}

/// One method to execute.
#[derive(Debug, Clone, Copy)]
struct Method {
    subchannel: u32,
    method: u32,
    data: u32,
}

/// Execution context of one turn.
pub(crate) struct Exec<'a> {
    pub core: &'a mut Core,
    pub ch: &'a mut Channel,
    pub chid: u32,
    /// GPU time at which the turn runs (semaphore timestamps).
    pub now: u64,
}

impl Exec<'_> {
    /// Runs the channel until it starts timed work, finishes an entry, idles, blocks or stops.
    pub(crate) fn run(&mut self) -> Outcome {
        if self.ch.acquire.is_some() {
            return Outcome::Blocked;
        }
        if std::mem::take(&mut self.ch.switched_out) && self.ch.seg.is_some() {
            // Switched out mid-entry by a preempt: restoring its state occupies the GPU.
            let duration = self.core.cost.ctxsw_ns;
            if duration > 0 {
                return Outcome::Restore { duration };
            }
        }
        if self.ch.seg.is_none() {
            return self.start_entry();
        }
        if self.ch.ctx.is_none() {
            // Resuming an entry after a preempt saved it: reload the context first.
            let Some((inst, target)) = self.ch.inst else {
                return Outcome::Idle;
            };
            let word = self.ch.inst_word();
            self.ch.ctx = Some(ChannelCtx::load(&mut self.core.mem, inst, target, word));
        }
        loop {
            let seg_done = self.ch.seg.as_ref().is_none_or(Segment::done);
            if seg_done {
                self.finish_entry();
                return Outcome::EntryDone;
            }
            let word = match self.next_word() {
                Ok(w) => w,
                Err(f) => return self.fault(f, fault::UNIT_PFIFO, fault::HUB_CLIENT_PFIFO, true),
            };
            if let Some(outcome) = self.word(word) {
                return outcome;
            }
        }
    }

    /// At an entry boundary: (re)load the context, check GP_PUT, fetch and decode the entry.
    fn start_entry(&mut self) -> Outcome {
        let Some((inst, target)) = self.ch.inst else {
            return Outcome::Idle;
        };
        let ctx = ChannelCtx::load(&mut self.core.mem, inst, target, self.ch.inst_word());
        self.ch.ctx = Some(ctx);
        // GP_PUT beyond the ring, or a USERD that cannot be read (invalid target, no memory).
        let gp_put = ctx
            .userd
            .and_then(|(u, t)| self.core.mem.read_u32(t, u + userd::GP_PUT));
        let Some(gp_put) = gp_put.filter(|&p| (p as u64) < ctx.ib_entries) else {
            return self.pbdma_error(pfifo::PBDMA_INTR_IB_PUT_OVERFLOW, None);
        };
        if gp_put == self.ch.gp_get {
            return Outcome::Idle;
        }
        let mut raw = [0u8; 8];
        let entry_va = ctx.ib_base.wrapping_add(self.ch.gp_get as u64 * 8);
        if let Err(f) = self.core.read_va(&ctx.vspace, entry_va, &mut raw) {
            return self.fault(f, fault::UNIT_PFIFO, fault::HUB_CLIENT_PFIFO, true);
        }
        let Ok(entry) = GpEntry::decode(u64::from_le_bytes(raw)) else {
            self.advance_gp_get();
            return self.pbdma_error(pfifo::PBDMA_INTR_IB_ENTRY_INVALID, None);
        };
        self.core.stats.gpfifo_entries += 1;
        self.ch.seg = Some(Segment {
            va: entry.va,
            unfetched: entry.length_dwords,
            buf: Vec::new(),
            pos: 0,
        });
        Outcome::Fetch {
            duration: self.core.cost.gpfifo_entry(entry.length_dwords),
        }
    }

    /// The segment is done: GP_GET moves past the entry and is written back to USERD.
    fn finish_entry(&mut self) {
        self.ch.seg = None;
        self.advance_gp_get();
    }

    fn advance_gp_get(&mut self) {
        let Some(ctx) = self.ch.ctx else { return };
        self.ch.gp_get = ((self.ch.gp_get as u64 + 1) % ctx.ib_entries) as u32;
        if let Some((u, t)) = ctx.userd {
            self.core
                .mem
                .write_u32(t, u + userd::GP_GET, self.ch.gp_get);
        }
    }

    /// The instance word of the loaded context (the channel's CHAN word if none is loaded).
    fn inst_word(&self) -> u32 {
        self.ch.ctx.map_or(self.ch.inst_word(), |c| c.inst_word)
    }

    fn vspace(&self) -> Vspace {
        self.ch
            .ctx
            .map(|c| c.vspace)
            .unwrap_or(Vspace { pd: None, limit: 0 })
    }

    /// The next pushbuffer dword, fetching up to the end of its page when the buffer is empty.
    fn next_word(&mut self) -> Result<u32, VaFault> {
        let vs = self.vspace();
        let Some(seg) = self.ch.seg.as_mut() else {
            return Ok(0);
        };
        if seg.pos >= seg.buf.len() {
            let n = (page_piece(seg.va, seg.unfetched as usize * 4) / 4).max(1);
            let mut bytes = vec![0u8; n * 4];
            self.core.read_va(&vs, seg.va, &mut bytes)?;
            seg.buf = bytes
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            seg.pos = 0;
            seg.va = seg.va.wrapping_add(n as u64 * 4);
            seg.unfetched = seg.unfetched.saturating_sub(n as u32);
        }
        let w = seg.buf.get(seg.pos).copied().unwrap_or(0);
        seg.pos += 1;
        Ok(w)
    }

    /// Feeds one pushbuffer word to the decoder; `Some` ends the turn.
    fn word(&mut self, word: u32) -> Option<Outcome> {
        if let Some(run) = self.ch.run.as_mut() {
            let m = Method {
                subchannel: run.subchannel,
                method: run.method,
                data: word,
            };
            run.remaining -= 1;
            match run.mode {
                Mode::Incrementing => run.method = (run.method + 4) & 0x3ffc,
                Mode::IncrementOnce => {
                    run.method = (run.method + 4) & 0x3ffc;
                    run.mode = Mode::NonIncrementing;
                }
                Mode::NonIncrementing => {}
            }
            if run.remaining == 0 {
                self.ch.run = None;
            }
            return self.method(m);
        }
        match Header::decode(word) {
            Ok(Header::Methods {
                mode,
                subchannel,
                method,
                count,
            }) => {
                if count > 0 {
                    self.ch.run = Some(MethodRun {
                        mode,
                        subchannel,
                        method,
                        remaining: count,
                    });
                }
                None
            }
            Ok(Header::Immediate {
                subchannel,
                method,
                data,
            }) => self.method(Method {
                subchannel,
                method,
                data,
            }),
            Ok(Header::SubDeviceMask) => None,
            Ok(Header::EndSegment) => {
                if let Some(seg) = self.ch.seg.as_mut() {
                    seg.unfetched = 0;
                    seg.pos = seg.buf.len();
                }
                None
            }
            Err(_) => Some(self.pbdma_error(
                pfifo::PBDMA_INTR_ILLEGAL_CMD,
                Some(Method {
                    subchannel: 0,
                    method: 0,
                    data: word,
                }),
            )),
        }
    }

    /// Executes one method; `Some` ends the turn.
    fn method(&mut self, m: Method) -> Option<Outcome> {
        self.core.stats.methods += 1;
        if m.method < host::HOST_METHOD_LIMIT {
            return self.host_method(m);
        }
        match self.ch.subch[(m.subchannel & 7) as usize] {
            Some(EngineClass::Copy) => self.copy_method(m),
            Some(EngineClass::Compute) => self.compute_method(m),
            Some(EngineClass::M2mf) => self.m2mf_method(m),
            Some(EngineClass::Host) | None => Some(self.illegal(m)),
        }
    }

    fn host_method(&mut self, m: Method) -> Option<Outcome> {
        match m.method {
            host::SET_OBJECT => match EngineClass::of(m.data & 0xffff) {
                Some(class) => self.ch.subch[(m.subchannel & 7) as usize] = Some(class),
                None => return Some(self.illegal(m)),
            },
            host::NOP | host::FB_FLUSH | host::CRC_CHECK | host::YIELD => {}
            host::SEMAPHORE_A => self.ch.sem.addr_hi = m.data,
            host::SEMAPHORE_B => self.ch.sem.addr_lo = m.data,
            host::SEMAPHORE_C => self.ch.sem.payload = m.data,
            host::SEMAPHORE_D => return self.semaphore(m),
            host::NON_STALL_INTERRUPT => self.core.intr.non_stall(host::ENGINE_PGRAPH),
            host::SET_REFERENCE => {
                if let Some((u, t)) = self.ch.ctx.and_then(|c| c.userd) {
                    self.core.mem.write_u32(t, u + userd::REFERENCE, m.data);
                }
            }
            host::MEM_OP_A => self.ch.mem_op_a = m.data,
            host::MEM_OP_B => return self.mem_op(m),
            _ => return Some(self.illegal(m)),
        }
        None
    }

    fn mem_op(&mut self, m: Method) -> Option<Outcome> {
        match host::mem_op_b_operation(m.data) {
            host::MEM_OP_MMU_TLB_INVALIDATE => {
                let flush = match host::mem_op_a_decode(self.ch.mem_op_a) {
                    Some((pd, target)) if m.data & host::MEM_OP_TLB_PDB_ALL == 0 => {
                        TlbFlush::Pd { pd, target }
                    }
                    _ => TlbFlush::All,
                };
                self.core.flush_tlb(flush);
            }
            host::MEM_OP_SYSMEMBAR_FLUSH
            | host::MEM_OP_SOFT_FLUSH
            | host::MEM_OP_L2_PEERMEM_INVALIDATE
            | host::MEM_OP_L2_SYSMEM_INVALIDATE
            | host::MEM_OP_L2_CLEAN_COMPTAGS
            | host::MEM_OP_L2_FLUSH_DIRTY => {}
            _ => return Some(self.illegal(m)),
        }
        None
    }

    fn semaphore(&mut self, m: Method) -> Option<Outcome> {
        let va = self.ch.sem.va();
        let payload = self.ch.sem.payload;
        let vs = self.vspace();
        match m.data & host::SEM_OP_MASK {
            op @ (host::SEM_OP_ACQUIRE | host::SEM_OP_ACQ_GEQ | host::SEM_OP_ACQ_AND) => {
                let acq = Acquire { va, payload, op };
                match self.core.read_va_u32(&vs, va) {
                    Ok(v) if acq.satisfied_by(v) => None,
                    Ok(_) => {
                        self.ch.block(acq);
                        Some(Outcome::Blocked)
                    }
                    Err(f) => Some(self.fault(f, fault::UNIT_PFIFO, fault::HUB_CLIENT_PFIFO, true)),
                }
            }
            host::SEM_OP_RELEASE => {
                let four_byte = m.data & host::SEM_RELEASE_4BYTE != 0;
                let r = release(self.core, &vs, va, payload, !four_byte, self.now);
                r.err()
                    .map(|f| self.fault(f, fault::UNIT_PFIFO, fault::HUB_CLIENT_PFIFO, true))
            }
            _ => Some(self.pbdma_error(pfifo::PBDMA_INTR_ILLEGAL_SEM, Some(m))),
        }
    }

    fn copy_method(&mut self, m: Method) -> Option<Outcome> {
        match self.ch.copy.method(m.method, m.data) {
            Err(_) => Some(self.illegal(m)),
            Ok(false) => None,
            Ok(true) => match copy::plan(&self.ch.copy, m.data) {
                Ok((job, done)) => Some(Outcome::Launch(Box::new(EngineOp::new(
                    host::ENGINE_PCOPY0,
                    job,
                    self.vspace(),
                    self.inst_word(),
                    self.ch.epoch,
                    Some(done),
                )))),
                Err(CopyError::Illegal) => Some(self.illegal(m)),
            },
        }
    }

    fn compute_method(&mut self, m: Method) -> Option<Outcome> {
        match self.ch.compute.method(m.method, m.data) {
            Err(_) => Some(self.illegal(m)),
            Ok(false) => None,
            Ok(true) => {
                let Ok(kernel) = self.ch.compute.kernel() else {
                    return Some(self.illegal(m));
                };
                Some(Outcome::Launch(Box::new(EngineOp::kernel(
                    self.core,
                    &kernel,
                    self.vspace(),
                    self.inst_word(),
                    self.ch.epoch,
                ))))
            }
        }
    }

    fn m2mf_method(&mut self, m: Method) -> Option<Outcome> {
        let Ok(action) = self.ch.m2mf.method(m.method, m.data) else {
            return Some(self.illegal(m));
        };
        let vs = self.vspace();
        let (done, write) = match action {
            Action::None => return None,
            Action::Launch(plan, done) => {
                self.core.stats.m2mf_transfers += 1;
                self.core.stats.m2mf_bytes += plan.bytes();
                return Some(Outcome::Launch(Box::new(EngineOp::new(
                    host::ENGINE_PGRAPH,
                    plan.job(),
                    vs,
                    self.inst_word(),
                    self.ch.epoch,
                    Some(done),
                ))));
            }
            Action::Complete(done) => (Some(done), None),
            Action::Write { va, bytes, done } => (done, Some((va, bytes))),
            Action::Notify { va, awaken } => {
                let mut b = [0u8; gf100::m2mf::NOTIFIER_BYTES];
                b[..8].copy_from_slice(&self.now.to_le_bytes());
                if let Err(f) = self.core.write_va(&vs, va, &b) {
                    return Some(self.gr_fault(f));
                }
                if awaken {
                    self.core.intr.non_stall(host::ENGINE_PGRAPH);
                }
                return None;
            }
        };
        if let Some((va, bytes)) = write {
            self.core.stats.m2mf_bytes += bytes.len() as u64;
            if let Err(f) = self.core.write_va(&vs, va, &bytes) {
                return Some(self.gr_fault(f));
            }
        }
        let done = done?;
        self.core.stats.m2mf_transfers += 1;
        if let Some(s) = done.sem {
            if let Err(f) = release(self.core, &vs, s.va, s.payload, s.four_word, self.now) {
                return Some(self.gr_fault(f));
            }
        }
        if done.non_stall {
            self.core.intr.non_stall(host::ENGINE_PGRAPH);
        }
        None
    }

    /// An MMU fault of PGRAPH work this channel runs (the same source `EngineOp` reports for
    /// PGRAPH).
    fn gr_fault(&mut self, f: VaFault) -> Outcome {
        self.fault(f, fault::UNIT_PGRAPH, fault::GPC_CLIENT_CTXCTL, false)
    }

    fn illegal(&mut self, m: Method) -> Outcome {
        self.pbdma_error(pfifo::PBDMA_INTR_ILLEGAL_MTHD, Some(m))
    }

    /// Reports a PBDMA error and stops the channel.
    fn pbdma_error(&mut self, bit: u32, m: Option<Method>) -> Outcome {
        let m = m.unwrap_or(Method {
            subchannel: 0,
            method: 0,
            data: 0,
        });
        self.core.report_pbdma_error(PbdmaError {
            bit,
            chid: self.chid,
            subchannel: m.subchannel,
            method: m.method,
            data: m.data,
        });
        self.ch.stop();
        self.ch.halted = true;
        Outcome::Stopped
    }

    /// Reports an MMU fault of this channel and stops it.
    fn fault(&mut self, f: VaFault, unit: u32, client: u32, hub: bool) -> Outcome {
        report_channel_fault(self.core, self.inst_word(), f, unit, client, hub);
        self.ch.stop();
        Outcome::Stopped
    }
}

/// Reports an MMU fault of the channel whose instance word is `inst`.
pub(crate) fn report_channel_fault(
    core: &mut Core,
    inst: u32,
    f: VaFault,
    unit: u32,
    client: u32,
    hub: bool,
) {
    let flags = FaultFlags {
        reason: f.reason,
        hub,
        write: f.write,
        client,
        gpc: 0,
    };
    core.report_fault(FaultReport {
        unit,
        inst,
        va: f.va,
        flags,
    });
}

/// A semaphore release: the payload alone, or (payload, 0, 64-bit timestamp `now`).
pub(crate) fn release(
    core: &mut Core,
    vs: &Vspace,
    va: u64,
    payload: u32,
    sixteen: bool,
    now: u64,
) -> Result<(), VaFault> {
    if !sixteen {
        return core.write_va(vs, va, &payload.to_le_bytes());
    }
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&payload.to_le_bytes());
    b[8..].copy_from_slice(&now.to_le_bytes());
    core.write_va(vs, va, &b)
}

/// Re-checks the acquire a blocked channel waits on: `Ok(true)` if it is satisfied now.
pub(crate) fn acquire_ready(core: &mut Core, ch: &Channel) -> Result<bool, VaFault> {
    let Some(acq) = ch.acquire else {
        return Ok(true);
    };
    let vs = ch
        .ctx
        .map(|c| c.vspace)
        .unwrap_or(Vspace { pd: None, limit: 0 });
    Ok(acq.satisfied_by(core.read_va_u32(&vs, acq.va)?))
}

/// The USERD key of a physical address (for the doorbell map).
pub(crate) fn userd_key(addr: u64, target: Target) -> (bool, u64) {
    (target.is_sysram(), addr & !(userd::SIZE - 1))
}
