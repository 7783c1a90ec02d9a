//! One hardware channel as PFIFO sees it: its channel-table words, the context loaded from its
//! instance block (page directory, USERD, GPFIFO ring), and the PBDMA state that survives
//! between scheduling turns (GP_GET, the pushbuffer segment being executed, the method being
//! assembled, subchannel bindings, semaphore and engine method registers).
//!
//! The context is (re)loaded from the instance block every time the channel starts a GPFIFO
//! entry, and before it continues an entry after a preempt (KICK) dropped it, so a device model
//! that rewrites an instance block (PDB, USERD, IB base) before kicking the channel is seen, as
//! GPUvm's shadow channels require.

use gf100::method::Mode;
use gf100::mmu::VA_LIMIT;
use gf100::{inst, pfifo, Target};
use gpuvm_phys::ChannelStateError;

use super::compute::ComputeRegs;
use super::copy::CopyRegs;
use super::m2mf::M2mfRegs;
use super::mem::Memory;
use super::mmu::Vspace;

/// Number of subchannels.
pub(crate) const SUBCHANNELS: usize = gf100::method::SUBCHANNELS as usize;

/// The engine a subchannel's object belongs to (from the class given to SET_OBJECT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum EngineClass {
    /// Class 0x906f: only host methods are valid.
    Host,
    /// Class 0x90b5: the copy engine.
    Copy,
    /// Class 0x90c0: the compute engine's fixed kernels.
    Compute,
    /// Class 0x9039: PGRAPH's memory-to-memory format object.
    M2mf,
}

impl EngineClass {
    /// The engine of `class`, if the model implements it.
    pub(crate) fn of(class: u32) -> Option<EngineClass> {
        match class {
            gf100::host::CLASS => Some(EngineClass::Host),
            gf100::copy::CLASS => Some(EngineClass::Copy),
            gf100::compute::CLASS => Some(EngineClass::Compute),
            gf100::m2mf::CLASS => Some(EngineClass::M2mf),
            _ => None,
        }
    }
}

/// What a channel's instance block says, read when the channel starts a GPFIFO entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChannelCtx {
    /// The channel's address space.
    pub vspace: Vspace,
    /// USERD page (RAMFC 0x08/0x0c); `None` for the invalid target.
    pub userd: Option<(u64, Target)>,
    /// GPFIFO ring base VA (RAMFC 0x48/0x4c).
    pub ib_base: u64,
    /// GPFIFO ring size in entries (`1 << order`, RAMFC 0x4c bits 16-31, at most 2^32).
    pub ib_entries: u64,
    /// The instance word (CHAN word, low 30 bits) the context was loaded from: what VM_FAULT
    /// reports for work this context runs, even after the channel is rebound.
    pub inst_word: u32,
}

impl ChannelCtx {
    /// Reads the context of the instance block at `inst`, bound by instance word `inst_word`.
    pub(crate) fn load(mem: &mut Memory, inst: u64, target: Target, inst_word: u32) -> ChannelCtx {
        let vspace = Vspace::load(mem, inst, target);
        let userd = mem
            .read_u64(target, inst + inst::RAMFC_USERD_LO)
            .and_then(inst::userd_decode);
        let ib_lo = mem
            .read_u32(target, inst + inst::RAMFC_IB_BASE_LO)
            .unwrap_or(0);
        let ib_cfg = mem
            .read_u32(target, inst + inst::RAMFC_IB_CONFIG)
            .unwrap_or(0);
        let order = (ib_cfg >> 16).min(32);
        ChannelCtx {
            vspace,
            userd,
            ib_base: ((ib_cfg & 0xff) as u64) << 32 | ib_lo as u64,
            ib_entries: 1u64 << order,
            inst_word,
        }
    }
}

/// The USERD page named by the instance block at `inst` (for the doorbell map).
pub(crate) fn userd_of(mem: &mut Memory, inst: u64, target: Target) -> Option<(u64, Target)> {
    mem.read_u64(target, inst + inst::RAMFC_USERD_LO)
        .and_then(inst::userd_decode)
}

/// A pushbuffer segment being executed (saved as it is, checked by [`Segment::check`] when
/// loaded).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Segment {
    /// VA of the next dword not yet fetched.
    pub va: u64,
    /// Dwords not yet fetched.
    pub unfetched: u32,
    /// Fetched dwords (at most up to the end of one page).
    pub buf: Vec<u32>,
    /// Next dword of `buf` to execute.
    pub pos: usize,
}

impl Segment {
    /// True when every dword has been executed.
    pub(crate) fn done(&self) -> bool {
        self.unfetched == 0 && self.pos >= self.buf.len()
    }
}

/// A method header whose data words are still arriving.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MethodRun {
    pub mode: Mode,
    pub subchannel: u32,
    pub method: u32,
    pub remaining: u32,
}

/// Host semaphore registers (SEMAPHOREA-C).
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct HostSem {
    pub addr_hi: u32,
    pub addr_lo: u32,
    pub payload: u32,
}

impl HostSem {
    /// The semaphore VA.
    pub(crate) fn va(&self) -> u64 {
        ((self.addr_hi & 0xff) as u64) << 32 | (self.addr_lo & !3) as u64
    }
}

/// A semaphore acquire the channel is waiting on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Acquire {
    pub va: u64,
    pub payload: u32,
    pub op: u32,
}

impl Acquire {
    /// True if `value` satisfies the acquire.
    pub(crate) fn satisfied_by(&self, value: u32) -> bool {
        gf100::host::acquire_satisfied(self.op, self.payload, value)
    }
}

/// One of the 128 channels.
#[derive(Debug, Default)]
pub(crate) struct Channel {
    /// CHAN word as written (0x3000 + chid*8).
    pub chan_word: u32,
    /// STATE word (0x3004 + chid*8); RUNNABLE is cleared by the model when the channel stops.
    pub state_word: u32,
    /// The bound instance block, if the CHAN word was accepted.
    pub inst: Option<(u64, Target)>,
    /// Context loaded at the start of the current GPFIFO entry.
    pub ctx: Option<ChannelCtx>,
    /// USERD page this channel is registered under in the doorbell map.
    pub doorbell_key: Option<(bool, u64)>,
    /// Index of the next GPFIFO entry to fetch.
    pub gp_get: u32,
    /// A doorbell / kick / enable happened: PFIFO must look at GP_PUT.
    pub pending: bool,
    /// In the current runlist.
    pub in_runlist: bool,
    /// The pushbuffer segment being executed.
    pub seg: Option<Segment>,
    /// The method header being executed.
    pub run: Option<MethodRun>,
    /// Objects bound to the subchannels.
    pub subch: [Option<EngineClass>; SUBCHANNELS],
    /// Host semaphore registers.
    pub sem: HostSem,
    /// MEM_OP_A as last written.
    pub mem_op_a: u32,
    /// Copy-engine method registers.
    pub copy: CopyRegs,
    /// Compute method registers.
    pub compute: ComputeRegs,
    /// M2MF method registers (and an inline transfer waiting for data).
    pub m2mf: M2mfRegs,
    /// Waiting on a semaphore acquire.
    pub acquire: Option<Acquire>,
    /// Stopped by a PBDMA error whose interrupt is still pending. A PBDMA stalls on its
    /// interrupt until software clears it (nouveau rewrites METHOD0 first), so RUNNABLE alone
    /// does not restart the channel meanwhile: nothing after the error runs before the error
    /// was seen.
    pub halted: bool,
    /// Modeled GPU time this channel has occupied, in ns.
    pub busy_ns: u64,
    /// A preempt (KICK) of this channel waits for its engine operation to end.
    pub preempt_pending: bool,
    /// A preempt switched the channel out in the middle of a GPFIFO entry: resuming it costs
    /// a context switch (`CostModel::ctxsw_ns`).
    pub switched_out: bool,
    /// Binding generation: incremented whenever the channel is bound to another instance (or
    /// unbound), so work launched by an earlier binding does not act on the new one.
    pub epoch: u64,
}

/// What [`Channel::save`] keeps of a channel: the PBDMA and method state that lives in the GPU
/// between submissions (on hardware, saved to RAMFC and the engine contexts by a context
/// switch; here a JSON document, validated when loaded). A channel stopped part-way through a
/// GPFIFO entry — parked on a semaphore acquire, disabled or preempted mid-segment — keeps the
/// segment it was executing (the dwords already fetched and where the rest is), the method
/// being assembled and the acquire it waits on, as PBDMA keeps them in RAMFC; its context is
/// not saved but reloaded from the (rebuilt) instance block before it runs again, as after a
/// preempt.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Saved {
    format: String,
    gp_get: u32,
    subch: Vec<Option<EngineClass>>,
    sem: HostSem,
    mem_op_a: u32,
    copy: CopyRegs,
    compute: ComputeRegs,
    #[serde(default)]
    m2mf: M2mfRegs,
    #[serde(default)]
    seg: Option<Segment>,
    #[serde(default)]
    run: Option<SavedRun>,
    #[serde(default)]
    acquire: Option<Acquire>,
}

/// [`MethodRun`] as saved (`mode`: 0 incrementing, 1 non-incrementing, 2 increment-once).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedRun {
    mode: u8,
    subchannel: u32,
    method: u32,
    remaining: u32,
}

/// The saved format; `gpuvm-sim-channel-1` (idle channels only, no segment, method or
/// acquire) is still read.
const SAVED_FORMAT: &str = "gpuvm-sim-channel-2";
const SAVED_FORMAT_V1: &str = "gpuvm-sim-channel-1";

fn invalid(what: String) -> ChannelStateError {
    ChannelStateError::Invalid(what)
}

impl Segment {
    /// Checks a segment read from a saved channel.
    fn check(self) -> Result<Segment, ChannelStateError> {
        // PBDMA fetches at most up to the end of a small page at a time.
        let page_dwords = (gf100::mmu::SMALL_PAGE_SIZE / 4) as usize;
        if self.buf.len() > page_dwords || self.pos > self.buf.len() {
            return Err(invalid(format!(
                "segment buffer of {} dwords at position {} (at most {page_dwords})",
                self.buf.len(),
                self.pos
            )));
        }
        if self.va >= VA_LIMIT
            || self.unfetched > gf100::gpfifo::MAX_LENGTH_DWORDS
            || self.va + self.unfetched as u64 * 4 > VA_LIMIT
        {
            return Err(invalid(format!(
                "segment of {} dwords at VA {:#x} is outside the address space",
                self.unfetched, self.va
            )));
        }
        Ok(self)
    }
}

impl SavedRun {
    fn save(r: &MethodRun) -> SavedRun {
        SavedRun {
            mode: match r.mode {
                Mode::Incrementing => 0,
                Mode::NonIncrementing => 1,
                Mode::IncrementOnce => 2,
            },
            subchannel: r.subchannel,
            method: r.method,
            remaining: r.remaining,
        }
    }

    fn load(self) -> Result<MethodRun, ChannelStateError> {
        let mode = match self.mode {
            0 => Mode::Incrementing,
            1 => Mode::NonIncrementing,
            2 => Mode::IncrementOnce,
            m => return Err(invalid(format!("method mode {m}"))),
        };
        if self.subchannel as usize >= SUBCHANNELS
            || self.method > gf100::method::MAX_METHOD
            || !self.method.is_multiple_of(4)
            || !(1..=gf100::method::MAX_COUNT).contains(&self.remaining)
        {
            return Err(invalid(format!(
                "method {:#x} on subchannel {} with {} words to come",
                self.method, self.subchannel, self.remaining
            )));
        }
        Ok(MethodRun {
            mode,
            subchannel: self.subchannel,
            method: self.method,
            remaining: self.remaining,
        })
    }
}

impl Channel {
    /// The channel's GPU-held state. Refused for a channel that is not bound; the caller
    /// refuses one with an operation on the GPU (`Fifo::save_channel`).
    pub(crate) fn save(&self, chid: u32) -> Result<Vec<u8>, ChannelStateError> {
        if self.inst.is_none() {
            return Err(ChannelStateError::NoChannel(chid));
        }
        let saved = Saved {
            format: SAVED_FORMAT.into(),
            gp_get: self.gp_get,
            subch: self.subch.to_vec(),
            sem: self.sem,
            mem_op_a: self.mem_op_a,
            copy: self.copy,
            compute: self.compute,
            m2mf: self.m2mf,
            seg: self.seg.clone(),
            run: self.run.as_ref().map(SavedRun::save),
            acquire: self.acquire,
        };
        serde_json::to_vec(&saved).map_err(|e| invalid(e.to_string()))
    }

    /// Loads what [`Channel::save`] produced into this bound, idle channel. Everything is
    /// checked before anything is changed. A restored segment, method or acquire continues
    /// when the channel is next scheduled, its context reloaded from the instance block first.
    pub(crate) fn restore(&mut self, chid: u32, state: &[u8]) -> Result<(), ChannelStateError> {
        if self.inst.is_none() {
            return Err(ChannelStateError::NoChannel(chid));
        }
        if self.seg.is_some() || self.run.is_some() || self.acquire.is_some() {
            return Err(ChannelStateError::Busy(chid));
        }
        let s: Saved = serde_json::from_slice(state).map_err(|e| invalid(e.to_string()))?;
        if s.format != SAVED_FORMAT && s.format != SAVED_FORMAT_V1 {
            return Err(invalid(format!(
                "format {:?}, expected {SAVED_FORMAT:?}",
                s.format
            )));
        }
        let subch: [Option<EngineClass>; SUBCHANNELS] =
            s.subch.try_into().map_err(|v: Vec<_>| {
                invalid(format!("{} subchannels, expected {SUBCHANNELS}", v.len()))
            })?;
        let seg = s.seg.map(Segment::check).transpose()?;
        // A method's data words may continue in the next GPFIFO entry: a run without a
        // segment is a state PBDMA can be in.
        let run = s.run.map(SavedRun::load).transpose()?;
        s.m2mf.check().map_err(invalid)?;
        if let Some(a) = s.acquire.filter(|a| a.va >= VA_LIMIT) {
            return Err(invalid(format!("acquire at VA {:#x}", a.va)));
        }
        self.gp_get = s.gp_get;
        self.subch = subch;
        self.sem = s.sem;
        self.mem_op_a = s.mem_op_a;
        self.copy = s.copy;
        self.compute = s.compute;
        self.m2mf = s.m2mf;
        self.ctx = None;
        self.seg = seg;
        self.run = run;
        if let Some(a) = s.acquire {
            self.block(a);
        }
        // PFIFO looks at the channel again (GP_PUT, or the restored segment).
        self.pending = true;
        Ok(())
    }

    /// Forgets all PBDMA state (a fresh bind, a new binding generation); keeps the table words,
    /// runlist membership, the busy-time account and a pending preempt (it completes when the
    /// operation in flight ends).
    pub(crate) fn reset_pbdma(&mut self) {
        *self = Channel {
            chan_word: self.chan_word,
            state_word: self.state_word & !pfifo::STATE_ACQUIRE_PENDING,
            busy_ns: self.busy_ns,
            in_runlist: self.in_runlist,
            preempt_pending: self.preempt_pending,
            epoch: self.epoch + 1,
            ..Channel::default()
        };
    }

    /// The instance block encoded as in the channel table, for VM_FAULT reports.
    pub(crate) fn inst_word(&self) -> u32 {
        self.chan_word & 0x3fff_ffff
    }

    /// Bound, in the runlist, runnable and not waiting on a semaphore.
    pub(crate) fn schedulable(&self) -> bool {
        self.inst.is_some()
            && self.in_runlist
            && self.state_word & pfifo::STATE_RUNNABLE != 0
            && self.acquire.is_none()
            && !self.halted
    }

    /// Has (or may have) work: a doorbell was seen or an entry is in progress.
    pub(crate) fn has_work(&self) -> bool {
        self.pending || self.seg.is_some()
    }

    /// Blocks on `acq` (sets STATE ACQUIRE_PENDING).
    pub(crate) fn block(&mut self, acq: Acquire) {
        self.acquire = Some(acq);
        self.state_word |= pfifo::STATE_ACQUIRE_PENDING;
    }

    /// Ends a wait.
    pub(crate) fn unblock(&mut self) {
        self.acquire = None;
        self.state_word &= !pfifo::STATE_ACQUIRE_PENDING;
    }

    /// Stops the channel after an error: clears STATE RUNNABLE (as nouveau's recovery does).
    pub(crate) fn stop(&mut self) {
        self.state_word &= !pfifo::STATE_RUNNABLE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_operations() {
        let a = |op, payload| Acquire { va: 0, payload, op };
        assert!(a(gf100::host::SEM_OP_ACQUIRE, 5).satisfied_by(5));
        assert!(!a(gf100::host::SEM_OP_ACQUIRE, 5).satisfied_by(6));
        assert!(a(gf100::host::SEM_OP_ACQ_GEQ, 5).satisfied_by(6));
        assert!(!a(gf100::host::SEM_OP_ACQ_GEQ, 5).satisfied_by(4));
        assert!(a(gf100::host::SEM_OP_ACQ_AND, 6).satisfied_by(2));
        assert!(!a(gf100::host::SEM_OP_ACQ_AND, 6).satisfied_by(1));
    }

    /// A bound channel stopped part-way: a fetched segment, a method with words to come and
    /// an acquire.
    fn parked() -> Channel {
        let mut c = Channel {
            inst: Some((0x1000, Target::Vram)),
            gp_get: 3,
            seg: Some(Segment {
                va: 0x20_0000,
                unfetched: 40,
                buf: vec![1, 2, 3, 4],
                pos: 2,
            }),
            run: Some(MethodRun {
                mode: Mode::IncrementOnce,
                subchannel: 5,
                method: 0x100,
                remaining: 2,
            }),
            ..Channel::default()
        };
        c.block(Acquire {
            va: 0x30_0000,
            payload: 9,
            op: gf100::host::SEM_OP_ACQ_GEQ,
        });
        c
    }

    fn fresh() -> Channel {
        Channel {
            inst: Some((0x8000, Target::Vram)),
            ..Channel::default()
        }
    }

    #[test]
    fn a_channel_stopped_part_way_is_saved_and_restored_whole() {
        let src = parked();
        let blob = src.save(1).unwrap();
        let mut dst = fresh();
        dst.restore(2, &blob).unwrap();
        assert_eq!(dst.gp_get, 3);
        let (a, b) = (src.seg.as_ref().unwrap(), dst.seg.as_ref().unwrap());
        assert_eq!(
            (a.va, a.unfetched, &a.buf, a.pos),
            (b.va, b.unfetched, &b.buf, b.pos)
        );
        let (a, b) = (src.run.unwrap(), dst.run.unwrap());
        assert_eq!(
            (a.mode, a.subchannel, a.method, a.remaining),
            (b.mode, b.subchannel, b.method, b.remaining)
        );
        assert_eq!(dst.acquire, src.acquire);
        assert_ne!(dst.state_word & pfifo::STATE_ACQUIRE_PENDING, 0);
        assert!(dst.ctx.is_none(), "the context is reloaded before it runs");
        assert!(dst.pending);
        // Into a channel that is itself part-way: refused, and it is left alone.
        let mut busy = parked();
        assert_eq!(busy.restore(4, &blob), Err(ChannelStateError::Busy(4)));
        assert_eq!(busy.gp_get, 3);
    }

    #[test]
    fn a_format_1_blob_of_an_idle_channel_is_still_read() {
        let mut idle = fresh();
        idle.gp_get = 7;
        let mut doc: serde_json::Value = serde_json::from_slice(&idle.save(0).unwrap()).unwrap();
        let o = doc.as_object_mut().unwrap();
        for k in ["seg", "run", "acquire"] {
            assert!(o.remove(k).is_some_and(|v| v.is_null()), "{k}");
        }
        o.insert("format".into(), SAVED_FORMAT_V1.into());
        let mut dst = fresh();
        dst.restore(0, &serde_json::to_vec(&doc).unwrap()).unwrap();
        assert_eq!(dst.gp_get, 7);
        assert!(dst.seg.is_none() && dst.run.is_none() && dst.acquire.is_none());
    }

    #[test]
    fn crafted_part_way_state_is_refused_and_changes_nothing() {
        let blob = parked().save(1).unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&blob).unwrap();
        type Edit = fn(&mut serde_json::Value);
        let cases: [(&str, Edit); 10] = [
            ("buffer over a page", |d| {
                d["seg"]["buf"] = vec![0u32; 1025].into()
            }),
            ("position past the buffer", |d| d["seg"]["pos"] = 5.into()),
            ("segment VA beyond 40 bits", |d| {
                d["seg"]["va"] = (1u64 << 40).into()
            }),
            ("segment running off the address space", |d| {
                d["seg"]["va"] = ((1u64 << 40) - 8).into()
            }),
            ("unfetched over an entry's length", |d| {
                d["seg"]["unfetched"] = (1u32 << 21).into()
            }),
            ("method mode 3", |d| d["run"]["mode"] = 3.into()),
            ("subchannel 8", |d| d["run"]["subchannel"] = 8.into()),
            ("no words to come", |d| d["run"]["remaining"] = 0.into()),
            ("unaligned method", |d| d["run"]["method"] = 0x101.into()),
            ("acquire VA beyond 40 bits", |d| {
                d["acquire"]["va"] = u64::MAX.into()
            }),
        ];
        for (what, edit) in cases {
            let mut d = doc.clone();
            edit(&mut d);
            let mut dst = fresh();
            let r = dst.restore(0, &serde_json::to_vec(&d).unwrap());
            assert!(
                matches!(r, Err(ChannelStateError::Invalid(_))),
                "{what}: {r:?}"
            );
            assert!(
                dst.seg.is_none() && dst.run.is_none() && dst.acquire.is_none(),
                "{what}: changed the channel"
            );
            assert_eq!(dst.state_word, 0, "{what}");
        }
    }

    #[test]
    fn context_is_read_from_the_instance_block() {
        let mut m = Memory::new(1 << 20);
        let inst = 0x1000;
        let w =
            |m: &mut Memory, off: u64, v: u32| assert!(m.write_u32(Target::Vram, inst + off, v));
        w(&mut m, inst::PDB_LO, 0x5_0000);
        w(&mut m, inst::LIMIT_LO, 0xffff_ffff);
        w(&mut m, inst::LIMIT_HI, 0xff);
        w(&mut m, inst::RAMFC_USERD_LO, 0x7_0000);
        w(&mut m, inst::RAMFC_IB_BASE_LO, 0x2000);
        w(
            &mut m,
            inst::RAMFC_IB_CONFIG,
            inst::ib_config_encode(0x12_0000_2000, 512),
        );
        let c = ChannelCtx::load(&mut m, inst, Target::Vram, 7);
        assert_eq!(c.inst_word, 7);
        assert_eq!(
            c.vspace,
            Vspace {
                pd: Some((0x5_0000, Target::Vram)),
                limit: (1 << 40) - 1
            }
        );
        assert_eq!(c.userd, Some((0x7_0000, Target::Vram)));
        assert_eq!((c.ib_base, c.ib_entries), (0x12_0000_2000, 512));
        w(&mut m, inst::RAMFC_IB_CONFIG, 0xffff_0000);
        assert_eq!(
            ChannelCtx::load(&mut m, inst, Target::Vram, 0).ib_entries,
            1 << 32
        );
    }
}
