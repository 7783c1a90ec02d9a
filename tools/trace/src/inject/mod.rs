//! Fault injection: mutate one VM's recorded trace ("guilty"), replay it next to the other
//! VMs' clean traces ("innocent", [`crate::replay::Role::Sync`]) on a fresh host, and check
//! the isolation invariants after each injection:
//!
//! * **no host panic** — the whole replay runs under `catch_unwind`;
//! * **no isolation breach** — every innocent VM's VRAM slice and guest RAM equal those of a
//!   clean replay of the same traces, except for words that hold GPU timestamps (found once per
//!   campaign by replaying the clean traces shifted by one simulated second: the words that
//!   differ then are the time-dependent ones), and no innocent VM received faults, errors or
//!   violations its clean replay did not;
//! * **no lost completion** — every innocent read synchronizes with the recording (its results
//!   arrive; see [`crate::replay`]) and every innocent VM completes as many submissions as in
//!   the clean replay;
//! * **the violation was counted** — the guilty VM's violations, delivered faults and PBDMA
//!   errors exceed its clean replay's (required only for the classes where the device model
//!   must notice: [`FaultClass::guarantees_detection`]);
//! * **no leak** — after every VM is destroyed the host has every channel, VRAM byte,
//!   hypervisor (shadow) page and DMA window back ([`crate::replay::leaks`]).
//!
//! Deterministic: injection `k` of class `c` with seed `s` always makes the same mutation.
//! This file holds the fault classes and the mutations; `campaign` runs them and checks.

use gf100::mmu::{Pde, PtRef, PtSize, Pte};
use gf100::pci::Bar;
use gf100::{gpfifo::GpEntry, inst, pbus, pfifo, pmc, userd, Target};

use crate::format::{Event, Op, Trace};

mod campaign;
pub use campaign::{campaign, CampaignOptions, ClassResult, Summary};

/// What is injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultClass {
    /// 1-3 bits flipped in the value of a write.
    BitFlip,
    /// A write moved to a random offset of a random BAR.
    RandomOffset,
    /// An access made with another width (1, 2 or 8 bytes), sometimes misaligned.
    WrongWidth,
    /// A write dropped.
    DropWrite,
    /// A write issued 2-4 times.
    DupWrite,
    /// A write swapped with one of the next eight writes.
    ReorderWrites,
    /// A 64-bit write split in halves, high half first with a device poll between, or one
    /// half lost.
    TornWrite,
    /// A page-table entry naming memory outside the VM (VRAM beyond the slice, RAM beyond
    /// guest RAM).
    OobPte,
    /// A page-directory entry naming a page table outside the VM.
    OobPde,
    /// A channel-table instance pointer outside the slice.
    OobInstance,
    /// The PRAMIN window (PMEM base) moved beyond the slice, then written through.
    OobWindow,
    /// A USERD pointer (RAMFC or the poll-area register) outside the VM.
    OobUserd,
    /// A runlist base outside the slice or a runlist length beyond its buffer.
    OobRunlist,
    /// A channel id outside the VM's partition (kick, channel table).
    OobChid,
    /// A GPFIFO entry with length 0, a huge length or an unmapped / odd address.
    BadGpfifo,
    /// 20-200 doorbells with random GP_PUT values.
    DoorbellStorm,
    /// 50-300 writes enabling, raising and acknowledging interrupts, with failing submissions
    /// and device polls between.
    IrqStorm,
    /// The VM destroyed right after a doorbell (work in flight).
    DestroyMidSubmission,
    /// A compute launch in a pushbuffer the driver wrote to guest RAM turned into a `loop`
    /// kernel of 2^60 iterations: an engine that hangs for modeled years, until the host's
    /// watchdog kills the channel.
    HungEngine,
    /// The channel whose doorbell was just rung unbound 0-7 events later (its work in flight):
    /// the GPU must not write through what the unbind freed (issue 11, finding 1).
    UnbindMidSubmission,
    /// A bound channel's instance block re-pointed at another page directory 0-7 events after
    /// a doorbell, through PRAMIN (issue 11, finding 2).
    RepointMidSubmission,
    /// A compute launch in a pushbuffer the driver wrote to guest RAM turned into a semaphore
    /// acquire that never succeeds (the channel parks on it for good, with the rest of its
    /// work behind it): the host must keep the parked channel off the engines, re-check it
    /// without letting it run or hold the GPU, and lose nothing of the innocent VM's work
    /// (the scheduler issue's parked-acquire class).
    ParkedAcquire,
}

impl FaultClass {
    /// Every class.
    pub const ALL: [FaultClass; 22] = [
        FaultClass::BitFlip,
        FaultClass::RandomOffset,
        FaultClass::WrongWidth,
        FaultClass::DropWrite,
        FaultClass::DupWrite,
        FaultClass::ReorderWrites,
        FaultClass::TornWrite,
        FaultClass::OobPte,
        FaultClass::OobPde,
        FaultClass::OobInstance,
        FaultClass::OobWindow,
        FaultClass::OobUserd,
        FaultClass::OobRunlist,
        FaultClass::OobChid,
        FaultClass::BadGpfifo,
        FaultClass::DoorbellStorm,
        FaultClass::IrqStorm,
        FaultClass::DestroyMidSubmission,
        FaultClass::HungEngine,
        FaultClass::UnbindMidSubmission,
        FaultClass::RepointMidSubmission,
        FaultClass::ParkedAcquire,
    ];

    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            FaultClass::BitFlip => "bitflip",
            FaultClass::RandomOffset => "random-offset",
            FaultClass::WrongWidth => "wrong-width",
            FaultClass::DropWrite => "drop-write",
            FaultClass::DupWrite => "dup-write",
            FaultClass::ReorderWrites => "reorder-writes",
            FaultClass::TornWrite => "torn-write",
            FaultClass::OobPte => "oob-pte",
            FaultClass::OobPde => "oob-pde",
            FaultClass::OobInstance => "oob-instance",
            FaultClass::OobWindow => "oob-window",
            FaultClass::OobUserd => "oob-userd",
            FaultClass::OobRunlist => "oob-runlist",
            FaultClass::OobChid => "oob-chid",
            FaultClass::BadGpfifo => "bad-gpfifo",
            FaultClass::DoorbellStorm => "doorbell-storm",
            FaultClass::IrqStorm => "irq-storm",
            FaultClass::DestroyMidSubmission => "destroy-mid-submission",
            FaultClass::HungEngine => "hung-engine",
            FaultClass::UnbindMidSubmission => "unbind-mid-submission",
            FaultClass::RepointMidSubmission => "repoint-mid-submission",
            FaultClass::ParkedAcquire => "parked-acquire",
        }
    }

    /// True if every injection of this class must be noticed by the device model (a
    /// violation, a delivered fault or PBDMA error, counted on the guilty VM).
    pub fn guarantees_detection(self) -> bool {
        matches!(
            self,
            FaultClass::OobInstance
                | FaultClass::OobWindow
                | FaultClass::OobChid
                | FaultClass::WrongWidth
        )
    }
}

impl std::fmt::Display for FaultClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for FaultClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        FaultClass::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown fault class '{s}' (one of: {}, all)",
                    FaultClass::ALL.map(|c| c.name()).join(", ")
                )
            })
    }
}

/// A small deterministic generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// A number in `[0, n)` (0 if `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> Option<T> {
        (!v.is_empty()).then(|| v[self.below(v.len() as u64) as usize])
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Facts about the guilty VM the mutations aim just past.
struct Target_ {
    slice: u64,
    ram: u64,
    channels: u32,
}

fn ev(seq: u64, op: Op) -> Event {
    Event {
        line: 0,
        seq,
        time_ns: 0,
        op,
    }
}

fn w32(bar: Bar, offset: u64, value: u64) -> Op {
    Op::Write {
        bar,
        offset,
        width: 4,
        value: value & 0xffff_ffff,
    }
}

fn is_inst_mem(bar: Bar, offset: u64) -> bool {
    bar == Bar::Bar3
        || (bar == Bar::Bar0
            && (pbus::PRAMIN_BASE as u64..(pbus::PRAMIN_BASE + pbus::PRAMIN_SIZE) as u64)
                .contains(&offset))
}

/// A VRAM address outside the slice.
fn oob_vram(r: &mut Rng, t: &Target_) -> u64 {
    match r.below(4) {
        0 => t.slice,
        1 => t.slice + (r.below(1 << 30) & !0xfff),
        2 => (1 << 40) - 0x1000,
        _ => t.slice * (2 + r.below(4)),
    }
}

/// A guest-RAM address outside guest RAM.
fn oob_sys(r: &mut Rng, t: &Target_) -> u64 {
    match r.below(3) {
        0 => t.ram,
        1 => t.ram + (r.below(1 << 30) & !0xfff),
        _ => (1 << 40) - 0x1000,
    }
}

/// Mutates `trace` (the guilty VM's) with one fault of `class`; returns the new trace and a
/// description of what was done.
pub fn mutate(trace: &Trace, class: FaultClass, r: &mut Rng) -> (Trace, String) {
    let t = Target_ {
        slice: trace.header.profile.vram_mib << 20,
        ram: trace.header.guest_ram,
        channels: trace.header.profile.channels,
    };
    let mut ev_ = trace.events.clone();
    let writes: Vec<usize> = (0..ev_.len()).filter(|&i| ev_[i].op.is_write()).collect();
    let interesting: Vec<usize> = writes
        .iter()
        .copied()
        .filter(|&i| matches!(ev_[i].op, Op::Write { value, bar, offset, .. } if value != 0 || (bar == Bar::Bar0 && !is_inst_mem(bar, offset))))
        .collect();
    let doorbells: Vec<usize> = writes
        .iter()
        .copied()
        .filter(|&i| matches!(ev_[i].op, Op::Write { bar: Bar::Bar1, offset, .. } if offset & 0xfff == userd::GP_PUT))
        .collect();
    let any_write = |r: &mut Rng| {
        if r.chance(50) {
            r.pick(&interesting)
        } else {
            r.pick(&writes)
        }
    };
    let seq_at = |ev_: &Vec<Event>, i: usize| ev_.get(i).map_or(u64::MAX, |e| e.seq);
    let desc: String;
    match class {
        FaultClass::BitFlip => {
            let i = any_write(r).unwrap_or(0);
            if let Op::Write { width, value, .. } = &mut ev_[i].op {
                let mut mask = 0u64;
                for _ in 0..1 + r.below(3) {
                    mask |= 1 << r.below(*width as u64 * 8);
                }
                *value ^= mask;
                desc = format!("line {}: value ^= {mask:#x}", ev_[i].line);
            } else {
                desc = "no write".into();
            }
        }
        FaultClass::RandomOffset => {
            let i = any_write(r).unwrap_or(0);
            let line = ev_[i].line;
            let bar = [Bar::Bar0, Bar::Bar1, Bar::Bar3][r.below(3) as usize];
            if let Op::Write {
                bar: b,
                offset,
                width,
                ..
            } = &mut ev_[i].op
            {
                *b = bar;
                *offset = r.below(bar.size()) & !(*width as u64 - 1);
                desc = format!("line {line}: now {bar:?}+{:#x}", *offset);
            } else {
                desc = "no write".into();
            }
        }
        FaultClass::WrongWidth => {
            // A 1- or 2-byte register write (refused and counted), sometimes misaligned. (The
            // apertures accept any width: bytes are legal memory accesses.)
            let regs: Vec<usize> = writes
                .iter()
                .copied()
                .filter(|&i| matches!(ev_[i].op, Op::Write { bar: Bar::Bar0, offset, .. } if !is_inst_mem(Bar::Bar0, offset)))
                .collect();
            let i = r.pick(&regs).unwrap_or(0);
            let line = ev_[i].line;
            if let Op::Write {
                width,
                value,
                offset,
                ..
            } = &mut ev_[i].op
            {
                let w = [1u8, 2][r.below(2) as usize];
                *width = w;
                *value &= (1 << (w * 8)) - 1;
                *offset += r.below(4 / w as u64) * w as u64;
                desc = format!("line {line}: width {w} at +{:#x}", *offset);
            } else {
                desc = "no write".into();
            }
        }
        FaultClass::DropWrite => {
            let i = any_write(r).unwrap_or(0);
            desc = format!("line {} dropped", ev_[i].line);
            ev_.remove(i);
        }
        FaultClass::DupWrite => {
            let i = any_write(r).unwrap_or(0);
            let n = 1 + r.below(3);
            for _ in 0..n {
                let e = ev_[i].clone();
                ev_.insert(i, e);
            }
            desc = format!("line {} issued {} times", ev_[i].line, n + 1);
        }
        FaultClass::ReorderWrites => {
            let i = r.below(writes.len().saturating_sub(1) as u64) as usize;
            let j = (i + 1 + r.below(8) as usize).min(writes.len() - 1);
            let (a, b) = (writes[i], writes[j]);
            let (oa, ob) = (ev_[a].op.clone(), ev_[b].op.clone());
            ev_[a].op = ob;
            ev_[b].op = oa;
            desc = format!("lines {} and {} swapped", ev_[a].line, ev_[b].line);
        }
        FaultClass::TornWrite => {
            let wide: Vec<usize> = writes
                .iter()
                .copied()
                .filter(|&i| matches!(ev_[i].op, Op::Write { width: 8, .. }))
                .collect();
            let i = r.pick(&wide).or_else(|| any_write(r)).unwrap_or(0);
            if let Op::Write {
                bar, offset, value, ..
            } = ev_[i].op
            {
                let seq = ev_[i].seq;
                let (lo, hi) = (w32(bar, offset, value), w32(bar, offset + 4, value >> 32));
                let repl = match r.below(3) {
                    0 => vec![ev(seq, hi), ev(seq, Op::Poll), ev(seq, lo)],
                    1 => vec![ev(seq, lo)],
                    _ => vec![ev(seq, hi)],
                };
                desc = format!("line {}: torn into {} parts", ev_[i].line, repl.len());
                ev_.splice(i..=i, repl);
            } else {
                desc = "no write".into();
            }
        }
        FaultClass::OobPte | FaultClass::OobPde => {
            let cands: Vec<usize> = writes
                .iter()
                .copied()
                .filter(|&i| matches!(ev_[i].op, Op::Write { bar, offset, value, width: 4 } if is_inst_mem(bar, offset) && offset % 8 == 0 && value != 0))
                .collect();
            let raw = if class == FaultClass::OobPte {
                if r.chance(50) {
                    Pte::new(oob_vram(r, &t), Target::Vram).encode()
                } else {
                    Pte::new(oob_sys(r, &t), Target::SysCoherent).encode()
                }
            } else {
                let pt = PtRef {
                    addr: oob_vram(r, &t),
                    target: Target::Vram,
                    vol: false,
                };
                let large = r.chance(50);
                Pde {
                    large: large.then_some(pt),
                    small: (!large).then_some(pt),
                    size: PtSize::Full,
                }
                .encode()
            };
            match r.pick(&cands) {
                Some(i) => {
                    let (bar, offset) = match ev_[i].op {
                        Op::Write { bar, offset, .. } => (bar, offset),
                        _ => unreachable!(),
                    };
                    let seq = ev_[i].seq;
                    desc = format!(
                        "line {}: {:#x} written at {bar:?}+{offset:#x}",
                        ev_[i].line, raw
                    );
                    ev_.splice(
                        i..=i,
                        [
                            ev(seq, w32(bar, offset, raw)),
                            ev(seq, w32(bar, offset + 4, raw >> 32)),
                        ],
                    );
                }
                None => desc = "no page-table write found".into(),
            }
        }
        FaultClass::OobInstance => {
            let cands: Vec<usize> = writes
                .iter()
                .copied()
                .filter(|&i| matches!(ev_[i].op, Op::Write { bar: Bar::Bar0, offset, .. } if (pfifo::CHAN_TABLE as u64..pfifo::CHAN_TABLE as u64 + 0x400).contains(&offset) && offset % 8 == 0))
                .collect();
            let addr = oob_vram(r, &t);
            match r.pick(&cands) {
                Some(i) => {
                    if let Op::Write { value, .. } = &mut ev_[i].op {
                        *value = 0xc000_0000 | ((addr >> 12) & 0x0fff_ffff);
                    }
                    desc = format!("line {}: instance at {addr:#x}", ev_[i].line);
                }
                None => desc = "no channel-table write".into(),
            }
        }
        FaultClass::OobWindow => {
            // Before one of the driver's PRAMIN writes: the window moved just past the slice
            // (or further), then a few writes through it; the driver's own writes that follow
            // use the moved window too, until it sets PMEM again.
            let pramin: Vec<usize> = writes
                .iter()
                .copied()
                .filter(|&i| matches!(ev_[i].op, Op::Write { bar: Bar::Bar0, offset, .. } if is_inst_mem(Bar::Bar0, offset)))
                .collect();
            let i = r.pick(&pramin).unwrap_or(0);
            let seq = seq_at(&ev_, i);
            let addr = if r.chance(70) {
                t.slice + (r.below(16) << 16)
            } else {
                oob_vram(r, &t)
            };
            let mut ops = vec![ev(seq, w32(Bar::Bar0, pbus::PMEM as u64, addr >> 16))];
            for _ in 0..1 + r.below(16) {
                let off = pbus::PRAMIN_BASE as u64 + (r.below(pbus::PRAMIN_SIZE as u64) & !3);
                ops.push(ev(seq, w32(Bar::Bar0, off, r.next_u64())));
            }
            desc = format!(
                "PMEM -> {addr:#x} and {} writes before line {}",
                ops.len() - 1,
                ev_[i].line
            );
            ev_.splice(i..i, ops);
        }
        FaultClass::OobUserd => {
            let cands: Vec<usize> = writes
                .iter()
                .copied()
                .filter(|&i| matches!(ev_[i].op, Op::Write { bar, offset, .. } if is_inst_mem(bar, offset) && offset & 0xfff == inst::RAMFC_USERD_LO))
                .collect();
            let (vram, addr) = if r.chance(50) {
                (true, oob_vram(r, &t))
            } else {
                (false, oob_sys(r, &t))
            };
            let raw = inst::userd_encode(
                addr,
                if vram {
                    Target::Vram
                } else {
                    Target::SysCoherent
                },
            );
            match r.pick(&cands) {
                Some(i) if r.chance(80) => {
                    let (bar, offset) = match ev_[i].op {
                        Op::Write { bar, offset, .. } => (bar, offset),
                        _ => unreachable!(),
                    };
                    let seq = ev_[i].seq;
                    ev_.splice(
                        i..=i,
                        [
                            ev(seq, w32(bar, offset, raw)),
                            ev(seq, w32(bar, offset + 4, raw >> 32)),
                        ],
                    );
                    desc = format!("line {}: USERD {raw:#x}", ev_[i].line);
                }
                _ => {
                    let i = r.below(ev_.len() as u64) as usize;
                    let seq = seq_at(&ev_, i);
                    let v = (addr >> 12) & 0x0fff_ffff;
                    ev_.insert(i, ev(seq, w32(Bar::Bar0, pfifo::USERD_POLL_BASE as u64, v)));
                    desc = format!("poll area {v:#x} before event {i}");
                }
            }
        }
        FaultClass::OobRunlist => {
            let i = r.pick(&doorbells).unwrap_or(ev_.len() / 2);
            let seq = seq_at(&ev_, i);
            let ops = if r.chance(50) {
                let a = oob_vram(r, &t);
                vec![
                    w32(
                        Bar::Bar0,
                        pfifo::RUNLIST_BASE as u64,
                        (a >> 12) & 0x0fff_ffff,
                    ),
                    w32(Bar::Bar0, pfifo::RUNLIST_SUBMIT as u64, 1 + r.below(4)),
                ]
            } else {
                vec![w32(
                    Bar::Bar0,
                    pfifo::RUNLIST_SUBMIT as u64,
                    0x400 + r.below(0xfc00),
                )]
            };
            desc = format!("{} runlist writes before event {i}", ops.len());
            for (k, op) in ops.into_iter().enumerate() {
                ev_.insert(i + k, ev(seq, op));
            }
        }
        FaultClass::OobChid => {
            // Outside the partition but inside the 7-bit channel field (higher ids alias).
            let chid = t.channels as u64 + r.below(pfifo::CHANNELS as u64 - t.channels as u64);
            let i = r.below(ev_.len() as u64) as usize;
            let seq = seq_at(&ev_, i);
            let op = match r.below(3) {
                0 => w32(Bar::Bar0, pfifo::KICK as u64, chid),
                1 => w32(
                    Bar::Bar0,
                    pfifo::CHAN_TABLE as u64 + chid * 8,
                    0xc000_0000 | r.below(t.slice >> 12),
                ),
                _ => w32(Bar::Bar0, pfifo::CHAN_TABLE as u64 + chid * 8 + 4, 0x401),
            };
            desc = format!("chid {chid} before event {i}");
            ev_.insert(i, ev(seq, op));
        }
        FaultClass::BadGpfifo => {
            // The GPFIFO entry written last before a doorbell.
            let db = r.pick(&doorbells);
            let entry = db.and_then(|d| {
                (d.saturating_sub(40)..d)
                    .rev()
                    .find(|&k| matches!(&ev_[k].op, Op::DmaWrite { data, .. } if data.len() == 8))
            });
            match entry {
                Some(k) => {
                    let (va, len) = match r.below(4) {
                        0 => (0x1000_0000u64, 0u32),
                        1 => (0x1000_0000, gf100::gpfifo::MAX_LENGTH_DWORDS),
                        2 => ((r.below(1 << 38) & !3) | (1 << 39), 1 + r.below(64) as u32),
                        _ => (r.below(1 << 40) & !3, r.below(1 << 21) as u32),
                    };
                    let (lo, hi) = GpEntry::new(va, len).encode_words();
                    if let Op::DmaWrite { data, .. } = &mut ev_[k].op {
                        data[..4].copy_from_slice(&lo.to_le_bytes());
                        data[4..].copy_from_slice(&hi.to_le_bytes());
                    }
                    desc = format!("line {}: GPFIFO entry va {va:#x} len {len}", ev_[k].line);
                }
                None => desc = "no GPFIFO entry found".into(),
            }
        }
        FaultClass::DoorbellStorm => {
            let i = r.pick(&doorbells).unwrap_or(0);
            let (bar, offset) = match ev_[i].op {
                Op::Write { bar, offset, .. } => (bar, offset),
                _ => (Bar::Bar1, userd::GP_PUT),
            };
            let seq = ev_[i].seq;
            let n = 20 + r.below(181);
            let storm: Vec<Event> = (0..n)
                .flat_map(|k| {
                    let v = r.below(2048);
                    let mut v = vec![ev(seq, w32(bar, offset, v))];
                    if k % 8 == 7 {
                        v.push(ev(seq, Op::Poll));
                    }
                    v
                })
                .collect();
            desc = format!("{n} doorbells after line {}", ev_[i].line);
            ev_.splice(i + 1..i + 1, storm);
        }
        FaultClass::IrqStorm => {
            let i = r.pick(&doorbells).unwrap_or(ev_.len() / 2);
            let seq = seq_at(&ev_, i);
            let n = 50 + r.below(251);
            let door = match ev_.get(i).map(|e| &e.op) {
                Some(Op::Write { bar, offset, .. }) => Some((*bar, *offset)),
                _ => None,
            };
            let mut storm = Vec::new();
            for k in 0..n {
                let op = match r.below(6) {
                    0 => w32(Bar::Bar0, pmc::INTR_EN_HOST as u64, 0xffff_ffff),
                    1 => w32(Bar::Bar0, pfifo::INTR_EN as u64, 0xffff_ffff),
                    2 => w32(Bar::Bar0, pfifo::INTR as u64, r.next_u64()),
                    3 => w32(
                        Bar::Bar0,
                        (pfifo::PBDMA_BASE + pfifo::PBDMA_INTR_EN) as u64
                            + r.below(pfifo::PBDMAS as u64) * pfifo::PBDMA_STRIDE as u64,
                        0xffff_ffff,
                    ),
                    4 => match door {
                        Some((bar, offset)) => w32(bar, offset, r.below(4096)),
                        None => w32(Bar::Bar0, pfifo::INTR as u64, 0xffff_ffff),
                    },
                    _ => w32(Bar::Bar0, pmc::INTR_HOST as u64, r.next_u64()),
                };
                storm.push(ev(seq, op));
                if k % 4 == 3 {
                    storm.push(ev(seq, Op::Poll));
                }
            }
            desc = format!("{n} interrupt writes at event {i}");
            let at = (i + 1).min(ev_.len());
            ev_.splice(at..at, storm);
        }
        FaultClass::HungEngine => {
            desc = hang_a_launch(&mut ev_, r);
        }
        FaultClass::ParkedAcquire => {
            desc = park_a_launch(&mut ev_, r);
        }
        FaultClass::DestroyMidSubmission => {
            let i = r.pick(&doorbells).unwrap_or(ev_.len() / 2);
            let cut = (i + 1 + r.below(8) as usize).min(ev_.len());
            let seq = seq_at(&ev_, cut.min(ev_.len() - 1));
            desc = format!(
                "destroyed {} events after line {}",
                cut - i - 1,
                ev_[i].line
            );
            ev_.truncate(cut);
            ev_.push(ev(seq, Op::Destroy));
        }
        FaultClass::UnbindMidSubmission => {
            let i = r.pick(&doorbells).unwrap_or(ev_.len() / 2);
            let at = (i + 1 + r.below(8) as usize).min(ev_.len());
            let seq = seq_at(&ev_, at.min(ev_.len() - 1));
            // The driver's poll area starts at BAR1 0: the doorbell's page is its channel.
            let g = match ev_[i].op {
                Op::Write { offset, .. } => (offset >> 12) as u32 % t.channels.max(1),
                _ => 0,
            };
            desc = format!(
                "channel {g} unbound {} events after line {}",
                at - i - 1,
                ev_[i].line
            );
            ev_.insert(
                at,
                ev(seq, w32(Bar::Bar0, u64::from(pfifo::chan_table(g)), 0)),
            );
        }
        FaultClass::RepointMidSubmission => {
            let binds: Vec<(u64, u32)> = ev_
                .iter()
                .filter_map(|e| match e.op {
                    Op::Write {
                        bar: Bar::Bar0,
                        offset,
                        value,
                        ..
                    } if pfifo::chan_table_index(offset as u32)
                        .is_some_and(|(_, state)| !state)
                        && value as u32 & pfifo::CHAN_VALID != 0 =>
                    {
                        pfifo::chan_decode(value as u32)
                            .filter(|(_, t)| *t == gf100::Target::Vram)
                            .map(|(a, _)| (a, value as u32))
                    }
                    _ => None,
                })
                .collect();
            let i = r.pick(&doorbells).unwrap_or(ev_.len() / 2);
            let at = (i + 1 + r.below(8) as usize).min(ev_.len());
            let seq = seq_at(&ev_, at.min(ev_.len() - 1));
            match r.pick(&binds) {
                Some((inst, _)) => {
                    let pd = r.below(t.slice >> 12) << 12;
                    let pdb = gf100::inst::pdb_encode(pd, gf100::Target::Vram);
                    let a = inst + gf100::inst::PDB_LO;
                    let win = u64::from(gf100::pbus::PRAMIN_BASE) + (a & 0xffff);
                    desc = format!(
                        "instance block {inst:#x} re-pointed at {pd:#x} {} events after line {}",
                        at - i - 1,
                        ev_[i].line
                    );
                    let ops = [
                        w32(
                            Bar::Bar0,
                            u64::from(gf100::pbus::PMEM),
                            u64::from(gf100::pbus::pmem_encode(a, gf100::Target::Vram)),
                        ),
                        Op::Write {
                            bar: Bar::Bar0,
                            offset: win + 4,
                            width: 4,
                            value: pdb >> 32,
                        },
                        Op::Write {
                            bar: Bar::Bar0,
                            offset: win,
                            width: 4,
                            value: pdb & 0xffff_ffff,
                        },
                    ];
                    for (k, op) in ops.into_iter().enumerate() {
                        ev_.insert(at + k, ev(seq, op));
                    }
                }
                None => desc = "no channel bound in VRAM".into(),
            }
        }
    }
    // Keep sequence numbers non-decreasing (moved events keep their slots' numbers).
    let mut last = 0;
    for e in &mut ev_ {
        if e.seq != 0 {
            e.seq = e.seq.max(last);
            last = e.seq;
        }
    }
    (
        Trace {
            header: trace.header.clone(),
            events: ev_,
        },
        desc,
    )
}

/// The compute launches found in pushbuffers the driver wrote to guest RAM: (event, word of the
/// KERNEL method header, subchannel, argument count), with all their arguments in the write.
fn kernel_launches(ev_: &[Event]) -> Vec<(usize, usize, u32, u32)> {
    use gf100::compute as cc;
    let mut found = Vec::new();
    for (k, e) in ev_.iter().enumerate() {
        let Op::DmaWrite { data, .. } = &e.op else {
            continue;
        };
        for (w, c) in data.chunks_exact(4).enumerate() {
            let word = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            let hit = (0..gf100::method::SUBCHANNELS).find_map(|s| {
                (6..=1 + cc::MAX_ARGS as u32)
                    .find(|&n| word == gf100::method::incr(s, cc::KERNEL, n))
                    .map(|n| (s, n))
            });
            if let Some((s, n)) = hit.filter(|&(_, n)| (w + 1 + n as usize) * 4 <= data.len()) {
                found.push((k, w, s, n));
            }
        }
    }
    found
}

/// Rewrites one compute launch found in the guest-RAM writes (an incrementing KERNEL method
/// with at least 6 words on any subchannel) into a `loop` kernel of 2^60 iterations writing
/// to the launch's first address argument.
fn hang_a_launch(ev_: &mut [Event], r: &mut Rng) -> String {
    use gf100::compute as cc;
    let Some((k, w, _, _)) = r.pick(&kernel_launches(ev_)) else {
        return "no kernel launch found".into();
    };
    let line = ev_[k].line;
    if let Op::DmaWrite { data, .. } = &mut ev_[k].op {
        let iterations: u64 = 1 << 60;
        let words = [
            cc::KernelId::Loop as u32,
            // ARG0/1 (the first address) stay.
            u32::from_le_bytes(data[(w + 2) * 4..(w + 3) * 4].try_into().unwrap_or([0; 4])),
            u32::from_le_bytes(data[(w + 3) * 4..(w + 4) * 4].try_into().unwrap_or([0; 4])),
            (iterations >> 32) as u32,
            iterations as u32,
        ];
        for (i, v) in words.iter().enumerate() {
            let o = (w + 1 + i) * 4;
            data[o..o + 4].copy_from_slice(&v.to_le_bytes());
        }
    }
    format!("line {line}: compute launch at word {w} made a 2^60-iteration loop")
}

/// Turns a compute launch found in a pushbuffer the driver wrote to guest RAM into a semaphore
/// acquire on the launch's first address that can never succeed (ACQ_AND with payload 0), its
/// remaining words swallowed by a NOP: the channel parks there for good.
fn park_a_launch(ev_: &mut [Event], r: &mut Rng) -> String {
    use gf100::host as hm;
    let Some((k, w, s, n)) = r.pick(&kernel_launches(ev_)) else {
        return "no kernel launch found".into();
    };
    let line = ev_[k].line;
    if let Op::DmaWrite { data, .. } = &mut ev_[k].op {
        let word =
            |i: usize| u32::from_le_bytes(data[i * 4..i * 4 + 4].try_into().unwrap_or([0; 4]));
        // ARG0/1 (words w+2, w+3): the launch's first address, mapped in the channel.
        let (lo, hi) = (word(w + 2), word(w + 3));
        let words = [
            gf100::method::incr(s, hm::SEMAPHORE_A, 4),
            hi & 0xff,
            lo & !3,
            0,
            hm::SEM_OP_ACQ_AND | hm::SEM_ACQUIRE_SWITCH,
            gf100::method::non_incr(s, hm::NOP, n - 5),
        ];
        for (i, v) in words.iter().enumerate() {
            let o = (w + i) * 4;
            data[o..o + 4].copy_from_slice(&v.to_le_bytes());
        }
    }
    format!("line {line}: compute launch at word {w} made an acquire that never succeeds")
}
