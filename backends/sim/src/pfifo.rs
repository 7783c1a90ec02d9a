//! PFIFO: the channel table (0x3000 + chid*8), runlist submission (0x2270/0x2274), the USERD
//! doorbell, channel kick (0x2634), and the scheduler that feeds the single GPU timeline.
//!
//! **Doorbell.** A write through BAR1, BAR3 or the PRAMIN window that lands on the GP_PUT word
//! (USERD + 0x8c) of a bound channel marks that channel pending; a map from USERD page to channel
//! ids (rebuilt on bind, unbind, runlist submission, kick, and when a channel's instance block
//! names a new USERD) keeps this O(1) per write. KICK and setting STATE RUNNABLE also make PFIFO
//! look at the channel's GP_PUT, which is always read from USERD memory.
//!
//! **KICK is preempt** (as on GF100: nouveau writes the chid and polls bit 20). Besides making
//! PFIFO look at GP_PUT, it unloads the channel: a channel with an engine operation in flight
//! reads back `chid | KICK_PENDING` until the operation has ended (through the context it
//! captured) or an engine reset aborted it; otherwise the PBDMA state is saved at once (a GPFIFO
//! fetch in flight is cancelled, the loaded context dropped) and the channel reloads its context
//! from the instance block before it executes anything further.
//!
//! **Timeline.** All work runs on one GPU timeline (real Fermi overlaps its copy engines with
//! PGRAPH; serializing them is a deliberate simplification so "GPU time" is well defined for the
//! scheduling experiments). PFIFO picks runnable channels with pending work from the runlist in
//! round-robin order and lets each run one GPFIFO entry at a time (switching at entry
//! boundaries). Fetching an entry and every engine operation occupy the timeline for their
//! modeled duration; the channel continues only once the clock has reached the end. A channel
//! blocked on a semaphore acquire gives the GPU to the others and is re-checked on every poll.

use std::collections::HashMap;

use gf100::{fault, host, pfifo};
use gpuvm_phys::ChannelStateError;

use super::bar::Written;
use super::budget::Budget;
use super::channel::{self, Channel};
use super::engine::{EngineWrites, Offload, Step};
use super::mem::Memory;
use super::pbdma::{self, Exec, Outcome, Work};
use super::Core;

const CHANNELS: usize = pfifo::CHANNELS as usize;
const ENGINES: usize = pfifo::ENGINES as usize;

/// Most channel turns one `advance` runs before returning (bounds the work done inside one
/// register access when the cost model makes work free); the rest continues on the next poll.
const MAX_TURNS: usize = 1 << 16;

/// How soon a caller is told to look again while the engine worker is behind the clock.
pub(crate) const WORKER_LAG_POLL_NS: u64 = 100_000;

/// When the GPU next changes state on its own ([`Fifo::next_event_kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NextEvent {
    /// Nothing in flight and nothing due: only a call starts anything.
    Idle,
    /// At this clock time.
    At(u64),
    /// An engine operation's end has passed and the worker is still doing its pieces: poll
    /// again [`WORKER_LAG_POLL_NS`] from now.
    WorkerBehind,
}

/// Timed work occupying the GPU.
#[derive(Debug)]
struct InFlight {
    chid: usize,
    start: u64,
    /// End time; `u64::MAX` while an engine operation's duration is not yet known (scanning).
    end: u64,
    work: Work,
}

/// PFIFO state.
#[derive(Debug)]
pub(crate) struct Fifo {
    channels: Vec<Channel>,
    runlist: Vec<u32>,
    runlist_base: u32,
    runlist_len: u32,
    runlist_rd_base: u32,
    poll_base: u32,
    ctrl: u32,
    subfifo_enable: u32,
    eng_subfifo_mask: [u32; ENGINES],
    kick: u32,
    doorbells: HashMap<(bool, u64), Vec<u32>>,
    rr_next: usize,
    current: Option<usize>,
    inflight: Option<InFlight>,
    gpu_time: u64,
    dirty: bool,
    n_blocked: usize,
    more_work: bool,
    /// How engine operations' memory accesses are spread over time.
    pub(crate) mode: EngineWrites,
    /// This call's allowance of engine work.
    pub(crate) budget: Budget,
    /// A piece the engine worker is to compute outside the lock (`crate::worker`).
    offload: Option<Offload>,
    /// Timed work finished so far (fetches, context restores, engine operations): the engine
    /// worker calls the event waker when its batch moved it (`crate::worker`).
    pub(crate) finished: u64,
    /// Launches so far (each engine operation's serial).
    launches: u64,
}

impl Default for Fifo {
    fn default() -> Self {
        let mut channels = Vec::with_capacity(CHANNELS);
        channels.resize_with(CHANNELS, Channel::default);
        Fifo {
            channels,
            runlist: Vec::new(),
            runlist_base: 0,
            runlist_len: 0,
            runlist_rd_base: 0,
            poll_base: 0,
            ctrl: 0,
            subfifo_enable: 0,
            eng_subfifo_mask: [0; ENGINES],
            kick: 0,
            doorbells: HashMap::new(),
            rr_next: 0,
            current: None,
            inflight: None,
            gpu_time: 0,
            dirty: false,
            n_blocked: 0,
            more_work: false,
            mode: EngineWrites::default(),
            budget: Budget::default(),
            offload: None,
            finished: 0,
            launches: 0,
        }
    }
}

/// The PFIFO engine (ENGINE_INTR / ENG_STATE index) doing `work`; `None` for command fetch
/// (PFIFO's own PBDMA).
fn engine_of(work: &Work) -> Option<u32> {
    match work {
        Work::Fetch | Work::Restore => None,
        Work::Engine(op) => Some(op.engine),
    }
}

/// The PMC ENABLE bit of PFIFO engine `e`.
fn pmc_enable_bit(e: u32) -> Option<u32> {
    match e {
        host::ENGINE_PGRAPH => Some(gf100::pmc::ENABLE_PGRAPH),
        host::ENGINE_PCOPY0 => Some(gf100::pmc::ENABLE_PCOPY0),
        host::ENGINE_PCOPY1 => Some(gf100::pmc::ENABLE_PCOPY1),
        _ => None,
    }
}

/// Channel-table index and word (0 CHAN, 4 STATE) of `offset`.
fn chan_index(offset: u32) -> Option<(usize, u32)> {
    let rel = offset.checked_sub(pfifo::CHAN_TABLE)?;
    let chid = (rel / pfifo::CHAN_TABLE_STRIDE) as usize;
    (rel % 4 == 0 && chid < CHANNELS).then_some((chid, rel % pfifo::CHAN_TABLE_STRIDE))
}

/// ENG_SUBFIFO_MASK index of `offset`.
fn eng_mask_index(offset: u32) -> Option<usize> {
    let rel = offset.checked_sub(pfifo::ENG_SUBFIFO_MASK)?;
    (rel % 4 == 0 && rel / 4 < pfifo::ENGINES).then_some((rel / 4) as usize)
}

impl Fifo {
    /// See `PhysicalGpu::channel_acquire`.
    pub(crate) fn channel_acquire(&self, chid: u32) -> gpuvm_phys::AcquireState {
        match self.channels.get(chid as usize).and_then(|c| c.acquire) {
            Some(a) => gpuvm_phys::AcquireState::Waiting(gpuvm_phys::SemAcquire {
                va: a.va,
                payload: a.payload,
                op: a.op,
            }),
            None => gpuvm_phys::AcquireState::None,
        }
    }

    /// See `PhysicalGpu::save_channel`. A channel with a fetch or an engine operation on the
    /// GPU is busy: that operation's effect cannot be captured part-way.
    pub(crate) fn save_channel(&self, chid: u32) -> Result<Vec<u8>, ChannelStateError> {
        if self
            .inflight
            .as_ref()
            .is_some_and(|f| f.chid == chid as usize)
        {
            return Err(ChannelStateError::Busy(chid));
        }
        match self.channels.get(chid as usize) {
            Some(c) => c.save(chid),
            None => Err(ChannelStateError::NoChannel(chid)),
        }
    }

    /// See `PhysicalGpu::restore_channel`.
    pub(crate) fn restore_channel(
        &mut self,
        chid: u32,
        state: &[u8],
    ) -> Result<(), ChannelStateError> {
        match self.channels.get_mut(chid as usize) {
            Some(c) => c.restore(chid, state)?,
            None => return Err(ChannelStateError::NoChannel(chid)),
        }
        self.recount_blocked();
        self.dirty = true;
        Ok(())
    }

    /// Reads a PFIFO control register; `None` if `offset` is not one.
    pub(crate) fn read_reg(&self, offset: u32) -> Option<u32> {
        Some(match offset {
            pfifo::CTRL => self.ctrl,
            pfifo::SUBFIFO_ENABLE => self.subfifo_enable,
            pfifo::USERD_POLL_BASE => self.poll_base,
            pfifo::RUNLIST_BASE => self.runlist_base,
            pfifo::RUNLIST_SUBMIT => self.runlist_len,
            pfifo::RUNLIST_RD_BASE => self.runlist_rd_base,
            pfifo::RUNLIST_RD_LEN => self.runlist_len & !pfifo::RUNLIST_PENDING,
            pfifo::KICK => {
                let pending = self.channels[self.kick as usize].preempt_pending;
                self.kick | if pending { pfifo::KICK_PENDING } else { 0 }
            }
            o if (pfifo::ENG_STATE..pfifo::eng_state(pfifo::ENGINES)).contains(&o)
                && o % 4 == 0 =>
            {
                self.eng_state((o - pfifo::ENG_STATE) / 4)
            }
            o => match (chan_index(o), eng_mask_index(o)) {
                (Some((chid, 0)), _) => self.channels[chid].chan_word,
                (Some((chid, _)), _) => self.channels[chid].state_word,
                (None, Some(e)) => self.eng_subfifo_mask[e],
                (None, None) => return None,
            },
        })
    }

    /// Writes a PFIFO control register at GPU time `now`; false if `offset` is not one.
    pub(crate) fn write_reg(&mut self, core: &mut Core, offset: u32, value: u32, now: u64) -> bool {
        match offset {
            pfifo::CTRL => self.ctrl = value & 1,
            pfifo::SUBFIFO_ENABLE => self.subfifo_enable = value & ((1 << pfifo::PBDMAS) - 1),
            pfifo::USERD_POLL_BASE => self.poll_base = value,
            pfifo::RUNLIST_BASE => self.runlist_base = value,
            pfifo::RUNLIST_SUBMIT => self.submit_runlist(core, value),
            pfifo::RUNLIST_RD_BASE | pfifo::RUNLIST_RD_LEN => {}
            pfifo::KICK => self.kick(core, value, now),
            o if (pfifo::ENG_STATE..pfifo::eng_state(pfifo::ENGINES)).contains(&o) => {}
            o => match (chan_index(o), eng_mask_index(o)) {
                (Some((chid, 0)), _) => self.write_chan(core, chid, value, now),
                (Some((chid, _)), _) => self.write_state(chid, value),
                (None, Some(e)) => self.eng_subfifo_mask[e] = value,
                (None, None) => return false,
            },
        }
        true
    }

    /// Binds or unbinds channel `chid` (CHAN word). An engine operation of the old binding keeps
    /// running to its end through the context it captured; a GPFIFO fetch in flight is dropped.
    fn write_chan(&mut self, core: &mut Core, chid: usize, value: u32, now: u64) {
        let new_inst = if value & pfifo::CHAN_VALID == 0 {
            None
        } else if let Some(inst) = pfifo::chan_decode(value) {
            if value & pfifo::CHAN_POLL_ENABLE != 0
                && pfifo::userd_poll_decode(self.poll_base).is_none()
            {
                core.report_chan_table_error(pfifo::CHAN_ERR_NO_POLL);
                None
            } else {
                Some(inst)
            }
        } else {
            core.report_chan_table_error(pfifo::CHAN_ERR_INVALID_TARGET);
            None
        };
        if self.channels[chid].inst != new_inst {
            self.cancel_fetch(core, chid, now);
            self.channels[chid].reset_pbdma();
            if self.current == Some(chid) {
                self.current = None;
            }
        }
        let ch = &mut self.channels[chid];
        ch.chan_word = value;
        ch.inst = new_inst;
        ch.pending = new_inst.is_some();
        self.rebuild_doorbells(&mut core.mem);
        self.recount_blocked();
        self.dirty = true;
    }

    /// The PBDMA's interrupt was cleared: channels it stopped on an error may run again once
    /// RUNNABLE (they continue after the offending method, as after nouveau's METHOD0 rewrite
    /// to a NOP).
    pub(crate) fn release_halted(&mut self) {
        for ch in self.channels.iter_mut().filter(|c| c.halted) {
            ch.halted = false;
            ch.pending = true;
            self.dirty = true;
        }
    }

    /// Writes channel `chid`'s STATE word; RUNNABLE makes PFIFO look at GP_PUT.
    fn write_state(&mut self, chid: usize, value: u32) {
        let ch = &mut self.channels[chid];
        let acquire = ch.state_word & pfifo::STATE_ACQUIRE_PENDING;
        ch.state_word = (value & !pfifo::STATE_ACQUIRE_PENDING) | acquire;
        if value & pfifo::STATE_RUNNABLE != 0 {
            ch.pending = true;
            self.dirty = true;
        }
    }

    /// KICK at GPU time `now`: PFIFO looks at the channel's GP_PUT again, and preempts the
    /// channel. With an engine operation of the channel in flight the preempt stays pending
    /// (KICK reads `chid | KICK_PENDING`) until the operation ends; otherwise it completes at
    /// once: a fetch in flight is cancelled, the loaded context is dropped (reloaded from the
    /// instance block before the channel executes anything further) and the channel is no
    /// longer resident. A blocked channel keeps the context its acquire is re-checked in.
    fn kick(&mut self, core: &mut Core, value: u32, now: u64) {
        let chid = (value & 0x7f) as usize;
        self.kick = chid as u32;
        if self.channels[chid].inst.is_some() {
            self.channels[chid].pending = true;
            self.dirty = true;
        }
        self.rebuild_doorbells(&mut core.mem);
        let engine_busy = self
            .inflight
            .as_ref()
            .is_some_and(|f| f.chid == chid && engine_of(&f.work).is_some());
        if engine_busy {
            self.channels[chid].preempt_pending = true;
            return;
        }
        self.cancel_fetch(core, chid, now);
        self.save_pbdma(chid);
    }

    /// Cancels a GPFIFO fetch of channel `chid` in flight at `now`: the time so far counts as
    /// busy, and the entry is fetched again from the same GP_GET when the channel resumes.
    fn cancel_fetch(&mut self, core: &mut Core, chid: usize, now: u64) {
        if !self
            .inflight
            .as_ref()
            .is_some_and(|f| f.chid == chid && matches!(f.work, Work::Fetch))
        {
            return;
        }
        let Some(f) = self.inflight.take() else {
            return;
        };
        let at = now.clamp(f.start, f.end);
        self.charge(core, chid, at - f.start);
        self.gpu_time = self.gpu_time.max(at);
        self.channels[chid].seg = None;
        self.dirty = true;
    }

    /// Completes a preempt of `chid`: the PBDMA state is saved (the channel keeps its position,
    /// and a channel waiting on a semaphore acquire keeps waiting) and its context dropped, so
    /// it is reloaded before the channel continues — also before a waiting acquire is checked
    /// again, which then reads the semaphore through the reloaded address space.
    fn save_pbdma(&mut self, chid: usize) {
        let ch = &mut self.channels[chid];
        ch.preempt_pending = false;
        ch.switched_out |= ch.seg.is_some();
        ch.ctx = None;
        if self.current == Some(chid) {
            self.current = None;
        }
        self.dirty = true;
    }

    /// Adds `ns` of occupied GPU time to the totals and to channel `chid`.
    fn charge(&mut self, core: &mut Core, chid: usize, ns: u64) {
        core.stats.busy_ns = core.stats.busy_ns.saturating_add(ns);
        let ch = &mut self.channels[chid];
        ch.busy_ns = ch.busy_ns.saturating_add(ns);
    }

    /// Submits the runlist at RUNLIST_BASE with `value & 0xfff` entries.
    fn submit_runlist(&mut self, core: &mut Core, value: u32) {
        self.runlist_len = value;
        self.runlist_rd_base = self.runlist_base;
        let count = (value & pfifo::RUNLIST_LEN_MASK) as u64;
        let base = pfifo::runlist_base_decode(self.runlist_base);
        let mut list = Vec::new();
        let mut seen = [false; CHANNELS];
        for i in 0..count {
            let chid = base
                .and_then(|(addr, target)| {
                    core.mem
                        .read_u32(target, addr + i * pfifo::RUNLIST_ENTRY_SIZE)
                })
                .unwrap_or(u32::MAX) as usize;
            if chid >= CHANNELS || self.channels[chid].inst.is_none() {
                core.report_sched_error(pfifo::SCHED_ERR_INACTIVE_CHANNEL);
                continue;
            }
            if !seen[chid] {
                seen[chid] = true;
                list.push(chid as u32);
            }
        }
        for (ch, &listed) in self.channels.iter_mut().zip(seen.iter()) {
            ch.in_runlist = listed;
            ch.pending |= listed;
        }
        self.runlist = list;
        self.rr_next = 0;
        core.intr.runlist_done();
        self.rebuild_doorbells(&mut core.mem);
        self.dirty = true;
    }

    /// Rebuilds the USERD page -> channels map from the bound channels' instance blocks.
    fn rebuild_doorbells(&mut self, mem: &mut Memory) {
        self.doorbells.clear();
        for (chid, ch) in self.channels.iter_mut().enumerate() {
            ch.doorbell_key = ch
                .inst
                .and_then(|(inst, target)| channel::userd_of(mem, inst, target))
                .map(|(addr, target)| pbdma::userd_key(addr, target));
            if let Some(key) = ch.doorbell_key {
                self.doorbells.entry(key).or_default().push(chid as u32);
            }
        }
    }

    /// Snoops a write through BAR1/BAR3/PRAMIN: a write covering a bound channel's GP_PUT word
    /// rings its doorbell.
    pub(crate) fn snoop(&mut self, w: Written) {
        let end = w.addr.saturating_add(w.len);
        let mut page = w.addr & !(gf100::userd::SIZE - 1);
        while page < end {
            let word = page + gf100::userd::GP_PUT;
            if w.addr < word + 4 && end > word {
                if let Some(chids) = self.doorbells.get(&pbdma::userd_key(page, w.target)) {
                    for &c in chids {
                        self.channels[c as usize].pending = true;
                    }
                    self.dirty = true;
                }
            }
            page += gf100::userd::SIZE;
        }
    }

    /// True while timed work is in flight (a fetch, a context restore, an engine operation).
    pub(crate) fn busy(&self) -> bool {
        self.inflight.is_some()
    }

    /// True while nothing is in flight, queued or blocked: [`Fifo::advance`] would only move
    /// the GPU's idle time.
    pub(crate) fn idle(&self) -> bool {
        self.inflight.is_none() && !self.dirty && self.n_blocked == 0
    }

    /// Runs everything due at `now`: completes timed work whose end has come, re-checks blocked
    /// acquires, and lets channels run until the GPU is busy past `now` or has nothing to do.
    /// With `engines` false an engine operation in flight is left to the engine worker
    /// (`crate::worker`): the GPU is busy with it until the worker has completed it.
    pub(crate) fn advance(&mut self, core: &mut Core, now: u64, engines: bool) {
        if self.idle() {
            self.gpu_time = self.gpu_time.max(now);
            return;
        }
        self.more_work = false;
        for _ in 0..MAX_TURNS {
            if let Some(f) = self.inflight.as_mut() {
                if let Work::Engine(op) = &mut f.work {
                    if !engines {
                        return;
                    }
                    match op.progress(core, f.start, now, self.mode, &mut self.budget) {
                        Step::Deferred => {
                            self.more_work = true;
                            return;
                        }
                        Step::Waiting => {
                            f.end = f.start.saturating_add(op.duration().unwrap_or(0));
                            return;
                        }
                        Step::Fault { at, fault } => {
                            self.engine_fault(core, at, fault);
                            continue;
                        }
                        Step::Offload(o) => {
                            self.offload = Some(o);
                            return;
                        }
                        Step::Complete => {
                            op.recycle(core);
                            f.end = f.start.saturating_add(op.duration().unwrap_or(0));
                        }
                    }
                }
                if f.end > now {
                    return;
                }
                let Some(f) = self.inflight.take() else {
                    return;
                };
                self.gpu_time = f.end;
                self.finish(core, f);
            }
            self.recheck_blocked(core);
            let Some(chid) = self.pick() else {
                self.dirty = false;
                self.gpu_time = self.gpu_time.max(now);
                return;
            };
            self.turn(core, chid);
        }
        self.more_work = true;
    }

    /// When the GPU next changes state on its own, seen at clock time `now`: `now` itself while
    /// work is due that a call's budget deferred; for an engine operation in flight, the time by
    /// which one budget's worth of its pieces is due (its end if the rest fits).
    ///
    /// With the engines on the worker (`engines_inline` false) an engine operation's event is
    /// its end, or — while the worker is behind the clock — [`WORKER_LAG_POLL_NS`] from `now`:
    /// a caller need not poll for work it does not do.
    pub(crate) fn next_event(&mut self, now: u64, engines_inline: bool) -> Option<u64> {
        match self.next_event_kind(now, engines_inline) {
            NextEvent::Idle => None,
            NextEvent::At(t) => Some(t),
            NextEvent::WorkerBehind => Some(now.saturating_add(WORKER_LAG_POLL_NS)),
        }
    }

    /// [`Fifo::next_event`] before it is put in terms of `now`.
    pub(crate) fn next_event_kind(&mut self, now: u64, engines_inline: bool) -> NextEvent {
        let mode = self.mode;
        if !engines_inline {
            if let Some(f) = &self.inflight {
                if let Work::Engine(_) = f.work {
                    return if f.end != u64::MAX && f.end > now {
                        NextEvent::At(f.end)
                    } else {
                        NextEvent::WorkerBehind
                    };
                }
            }
        }
        if self.more_work {
            return NextEvent::At(now.max(self.gpu_time));
        }
        let Some(f) = self.inflight.as_mut() else {
            return NextEvent::Idle;
        };
        NextEvent::At(match &mut f.work {
            Work::Engine(op) => op.horizon(f.start, mode).min(f.end),
            Work::Fetch | Work::Restore => f.end,
        })
    }

    /// The piece the last `advance` left for the engine worker to compute outside the lock.
    pub(crate) fn take_offload(&mut self) -> Option<Offload> {
        self.offload.take()
    }

    /// Up to `max` more blocks of the engine operation in flight after the offloaded piece
    /// `after` ([`EngineOp::gather_ahead`](super::engine::EngineOp::gather_ahead)).
    pub(crate) fn gather_ahead(
        &mut self,
        core: &mut Core,
        now: u64,
        after: u64,
        max: usize,
    ) -> Vec<Offload> {
        let mode = self.mode;
        let more = match self.inflight.as_mut() {
            Some(f) => match &mut f.work {
                Work::Engine(op) => op.gather_ahead(core, f.start, now, mode, after, max),
                _ => Vec::new(),
            },
            None => Vec::new(),
        };
        self.budget.stats.gathered_ahead += more.len() as u64;
        more
    }

    /// Writes an offloaded piece's results, computed outside the lock, if its operation is
    /// still in flight at that piece (an engine reset or fault meanwhile drops them); a fault
    /// writing them ends the operation as a fault in the piece would.
    pub(crate) fn commit_offload(&mut self, core: &mut Core, o: Offload, data: &[u8]) {
        let Some(f) = self.inflight.as_mut() else {
            return;
        };
        let Work::Engine(op) = &mut f.work else {
            return;
        };
        if let Err(fault) = op.commit(core, &o, data, &mut self.budget) {
            self.engine_fault(core, o.due, fault);
        }
    }

    /// True while an engine operation is in flight.
    pub(crate) fn engine_in_flight(&self) -> bool {
        matches!(&self.inflight, Some(f) if matches!(f.work, Work::Engine(_)))
    }

    /// For the engine worker: when work in flight is next due, seen at `now` (`now` while work
    /// is due that a batch deferred; `None` with nothing in flight).
    pub(crate) fn engine_due(&self, now: u64) -> Option<u64> {
        let f = self.inflight.as_ref()?;
        if self.more_work {
            return Some(now);
        }
        // Command fetch too: the worker carries the GPU on to the next launch by itself.
        Some(match &f.work {
            Work::Engine(op) => op.next_due(f.start, self.mode),
            Work::Fetch | Work::Restore => f.end,
        })
    }

    /// ENG_STATE\[e\]: BUSY and the channel while engine `e` runs an operation, else 0.
    pub(crate) fn eng_state(&self, e: u32) -> u32 {
        match &self.inflight {
            Some(f) if engine_of(&f.work) == Some(e) => pfifo::ENG_STATE_BUSY | f.chid as u32,
            _ => 0,
        }
    }

    /// The engine operation in flight faulted in the piece due at `at`: it ends there (the time
    /// so far counts as busy), the fault names the context that launched it, and the channel
    /// stops if it is still that binding.
    fn engine_fault(&mut self, core: &mut Core, at: u64, fault: super::mmu::VaFault) {
        let Some(f) = self.inflight.take() else {
            return;
        };
        let Work::Engine(op) = f.work else {
            return;
        };
        self.charge(core, f.chid, at.saturating_sub(f.start));
        self.gpu_time = self.gpu_time.max(at);
        let (unit, client, hub) = op.fault_source();
        pbdma::report_channel_fault(core, op.inst_word, fault, unit, client, hub);
        if self.channels[f.chid].epoch == op.epoch {
            self.channels[f.chid].stop();
        }
        self.end_of_op(f.chid);
    }

    /// An engine operation of `chid` ended (completed, faulted or aborted): a pending preempt
    /// of the channel completes.
    fn end_of_op(&mut self, chid: usize) {
        if self.channels[chid].preempt_pending {
            self.save_pbdma(chid);
        }
        self.dirty = true;
    }

    /// PMC ENABLE bits in `cleared` went from 1 to 0 at `now`: an engine held in reset aborts
    /// the operation it is running. The timeline is freed at `now` (the time so far counts as
    /// busy), the channel is stopped (STATE RUNNABLE cleared) and its PBDMA stops at the entry
    /// boundary it was in (the rest of the segment is dropped); memory effects already done
    /// stay. Returns true if an operation was aborted.
    pub(crate) fn reset_engines(&mut self, core: &mut Core, cleared: u32, now: u64) -> bool {
        let hit = self.inflight.as_ref().is_some_and(|f| {
            engine_of(&f.work)
                .and_then(pmc_enable_bit)
                .is_some_and(|bit| cleared & bit != 0)
        });
        if !hit {
            return false;
        }
        let Some(f) = self.inflight.take() else {
            return false;
        };
        let at = now.clamp(f.start, f.end);
        self.charge(core, f.chid, at - f.start);
        core.stats.engine_aborts += 1;
        self.gpu_time = self.gpu_time.max(at);
        let same_binding =
            matches!(&f.work, Work::Engine(op) if op.epoch == self.channels[f.chid].epoch);
        if same_binding {
            let ch = &mut self.channels[f.chid];
            ch.seg = None;
            ch.run = None;
            ch.stop();
            if self.current == Some(f.chid) {
                self.current = None;
            }
        }
        self.end_of_op(f.chid);
        true
    }

    /// Modeled GPU time channel `chid` has occupied, plus the part of its work in flight
    /// elapsed at clock time `now`.
    pub(crate) fn channel_busy_ns(&self, chid: usize, now: u64) -> Option<u64> {
        let ch = self.channels.get(chid)?;
        let running = match &self.inflight {
            Some(f) if f.chid == chid => now.min(f.end).saturating_sub(f.start),
            _ => 0,
        };
        Some(ch.busy_ns.saturating_add(running))
    }

    /// The next channel to run: the one in the middle of an entry, else round-robin over the
    /// runlist among schedulable channels with pending work.
    fn pick(&mut self) -> Option<usize> {
        if let Some(c) = self.current {
            let ch = &self.channels[c];
            if ch.schedulable() && ch.has_work() {
                return Some(c);
            }
            self.current = None;
        }
        let n = self.runlist.len();
        for i in 0..n {
            let idx = (self.rr_next + i) % n;
            let c = self.runlist[idx] as usize;
            let ch = &self.channels[c];
            if ch.schedulable() && ch.has_work() {
                self.rr_next = (idx + 1) % n;
                self.current = Some(c);
                return Some(c);
            }
        }
        None
    }

    /// Gives channel `chid` a turn at the current GPU time.
    fn turn(&mut self, core: &mut Core, chid: usize) {
        let now = self.gpu_time;
        let ch = &mut self.channels[chid];
        let outcome = Exec {
            core: &mut *core,
            ch: &mut *ch,
            chid: chid as u32,
            now,
        }
        .run();
        match outcome {
            Outcome::Fetch { duration } => {
                self.inflight = Some(InFlight {
                    chid,
                    start: now,
                    end: now.saturating_add(duration),
                    work: Work::Fetch,
                });
            }
            Outcome::Restore { duration } => {
                self.inflight = Some(InFlight {
                    chid,
                    start: now,
                    end: now.saturating_add(duration),
                    work: Work::Restore,
                });
            }
            Outcome::Launch(mut op) => {
                self.launches += 1;
                op.serial = self.launches;
                self.inflight = Some(InFlight {
                    chid,
                    start: now,
                    end: u64::MAX,
                    work: Work::Engine(op),
                });
            }
            Outcome::Idle => {
                ch.pending = false;
                self.current = None;
            }
            Outcome::Blocked => {
                self.n_blocked += 1;
                self.current = None;
            }
            Outcome::EntryDone | Outcome::Stopped => self.current = None,
        }
        let key = ch
            .ctx
            .and_then(|c| c.userd)
            .map(|(a, t)| pbdma::userd_key(a, t));
        if ch.ctx.is_some() && key != ch.doorbell_key {
            self.rebuild_doorbells(&mut core.mem);
        }
    }

    /// Accounts finished timed work and performs its completion actions, in the context the
    /// operation captured at launch (a fault names that context's instance block; the channel
    /// is stopped only if it is still the same binding).
    fn finish(&mut self, core: &mut Core, f: InFlight) {
        self.finished += 1;
        self.charge(core, f.chid, f.end - f.start);
        self.dirty = true;
        let Work::Engine(op) = f.work else {
            return;
        };
        core.stats.engine_ops += 1;
        if let Some(done) = op.done {
            let mut ok = true;
            if let Some(s) = done.sem {
                let vs = op.vspace;
                if let Err(e) = pbdma::release(core, &vs, s.va, s.payload, s.four_word, f.end) {
                    let (unit, client, hub) = op.fault_source();
                    pbdma::report_channel_fault(core, op.inst_word, e, unit, client, hub);
                    if self.channels[f.chid].epoch == op.epoch {
                        self.channels[f.chid].stop();
                    }
                    ok = false;
                }
            }
            if ok && done.non_stall {
                core.intr.non_stall(op.engine);
            }
        }
        self.end_of_op(f.chid);
    }

    /// Re-checks every blocked acquire; satisfied ones resume, faulting ones stop.
    fn recheck_blocked(&mut self, core: &mut Core) {
        if self.n_blocked == 0 {
            return;
        }
        for ch in self.channels.iter_mut().filter(|c| c.acquire.is_some()) {
            let runnable =
                ch.inst.is_some() && ch.in_runlist && ch.state_word & pfifo::STATE_RUNNABLE != 0;
            if !runnable {
                continue;
            }
            // A preempted channel reloads its context before it reads anything again.
            if let (None, Some((inst, target))) = (ch.ctx, ch.inst) {
                let word = ch.inst_word();
                ch.ctx = Some(channel::ChannelCtx::load(&mut core.mem, inst, target, word));
            }
            match pbdma::acquire_ready(core, ch) {
                Ok(true) => {
                    ch.unblock();
                    self.dirty = true;
                }
                Ok(false) => {}
                Err(e) => {
                    pbdma::report_channel_fault(
                        core,
                        ch.ctx.map_or(ch.inst_word(), |c| c.inst_word),
                        e,
                        fault::UNIT_PFIFO,
                        fault::HUB_CLIENT_PFIFO,
                        true,
                    );
                    ch.unblock();
                    ch.stop();
                }
            }
        }
        self.recount_blocked();
    }

    fn recount_blocked(&mut self) {
        self.n_blocked = self.channels.iter().filter(|c| c.acquire.is_some()).count();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::CostModel;
    use gf100::{inst, Target};

    fn core() -> Core {
        Core::new(16 << 20, CostModel::instant())
    }

    #[test]
    fn binding_needs_a_poll_area_and_a_valid_target() {
        let (mut c, mut f) = (core(), Fifo::default());
        assert!(f.write_reg(
            &mut c,
            pfifo::chan_table(3),
            pfifo::chan_encode(0x1000, Target::Vram),
            0
        ));
        assert_eq!(
            c.intr.read(pfifo::CHAN_TABLE_ERROR),
            Some(pfifo::CHAN_ERR_NO_POLL)
        );
        assert!(f.channels[3].inst.is_none());
        f.write_reg(
            &mut c,
            pfifo::USERD_POLL_BASE,
            pfifo::userd_poll_encode(0),
            0,
        );
        f.write_reg(
            &mut c,
            pfifo::chan_table(3),
            pfifo::CHAN_VALID | 1 << 28 | 1,
            0,
        );
        assert_eq!(
            c.intr.read(pfifo::CHAN_TABLE_ERROR),
            Some(pfifo::CHAN_ERR_INVALID_TARGET)
        );
        f.write_reg(
            &mut c,
            pfifo::chan_table(3),
            pfifo::chan_encode(0x1000, Target::Vram),
            0,
        );
        assert_eq!(f.channels[3].inst, Some((0x1000, Target::Vram)));
        assert_eq!(
            f.read_reg(pfifo::chan_table(3)),
            Some(pfifo::chan_encode(0x1000, Target::Vram))
        );
        assert_eq!(c.stats.sched_errors, 2);
    }

    #[test]
    fn runlist_rejects_unknown_and_unbound_channels() {
        let (mut c, mut f) = (core(), Fifo::default());
        f.write_reg(
            &mut c,
            pfifo::USERD_POLL_BASE,
            pfifo::userd_poll_encode(0),
            0,
        );
        f.write_reg(
            &mut c,
            pfifo::chan_table(1),
            pfifo::chan_encode(0x1000, Target::Vram),
            0,
        );
        for (i, chid) in [1u32, 200, 2, 1].iter().enumerate() {
            assert!(c.mem.write_u32(Target::Vram, 0x8000 + i as u64 * 8, *chid));
        }
        f.write_reg(
            &mut c,
            pfifo::RUNLIST_BASE,
            pfifo::runlist_base_encode(0x8000, Target::Vram),
            0,
        );
        f.write_reg(
            &mut c,
            pfifo::RUNLIST_SUBMIT,
            pfifo::RUNLIST_SUBMIT_UNK20 | 4,
            0,
        );
        assert_eq!(f.runlist, vec![1]);
        assert_eq!(c.stats.sched_errors, 2);
        assert_eq!(
            c.intr.read(pfifo::SCHED_ERROR),
            Some(pfifo::SCHED_ERR_INACTIVE_CHANNEL)
        );
        assert_eq!(
            f.read_reg(pfifo::RUNLIST_RD_LEN)
                .map(|v| v & pfifo::RUNLIST_PENDING),
            Some(0)
        );
        assert_ne!(c.intr.pfifo_intr() & pfifo::INTR_RUNLIST_DONE, 0);
    }

    #[test]
    fn doorbell_map_follows_the_instance_block() {
        let (mut c, mut f) = (core(), Fifo::default());
        assert!(c.mem.write(
            Target::Vram,
            0x1000 + inst::RAMFC_USERD_LO,
            &inst::userd_encode(0x9000, Target::Vram).to_le_bytes()
        ));
        f.write_reg(
            &mut c,
            pfifo::USERD_POLL_BASE,
            pfifo::userd_poll_encode(0),
            0,
        );
        f.write_reg(
            &mut c,
            pfifo::chan_table(5),
            pfifo::chan_encode(0x1000, Target::Vram),
            0,
        );
        f.channels[5].pending = false;
        f.snoop(Written {
            target: Target::Vram,
            addr: 0x9088,
            len: 4,
        });
        assert!(!f.channels[5].pending, "GP_GET is not the doorbell");
        f.snoop(Written {
            target: Target::Vram,
            addr: 0x908c,
            len: 4,
        });
        assert!(f.channels[5].pending);
        f.channels[5].pending = false;
        f.snoop(Written {
            target: Target::SysCoherent,
            addr: 0x908c,
            len: 4,
        });
        assert!(
            !f.channels[5].pending,
            "same address in system memory is another page"
        );
    }
}
