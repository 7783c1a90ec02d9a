//! `vgpu_mmio`: VM 0 of a two-VM `GpuHost` performs a fuzzer-chosen sequence of BAR0, BAR1,
//! BAR3 and config-space accesses (offsets biased toward `BAR0_REGIONS`), interleaved with
//! clock advances, polls and, rarely, its own destruction. Invariants: nothing panics; VM 1's
//! VRAM slice (sampled pages filled with a pattern), VM 1's guest RAM and VM 1's physical
//! channel registers are unchanged afterwards, also after VM 0 is destroyed.
//!
//! **Checkpoint starts.** An input whose first byte has bit 7 set does not start from a fresh
//! VM 0 but from a *checkpoint*: a recorded trace's prefix (a driver's bring-up and part of its
//! workloads) replayed once per process, snapshotted with `gpuvm::migrate` and restored before
//! each such input (`crate::seeds::checkpoint_plan`). A checkpoint seed is the rest of the
//! trace, so it reaches the trace's deep states (channels bound, page tables built, work in
//! flight) while executing only its tail: the trace seeds' 1,000-3,800 operations per input
//! were what held them to a few hundred executions per second. The restore itself is part of
//! what is fuzzed: it runs the device model's own restore path every time.

use std::sync::Arc;

use gf100::pfifo;
use gpuvm::addr::HostVram;
use gpuvm::clock::{Clock, SimClock};
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::phys::{Bar, PhysicalGpu};
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm::vgpu::Vgpu;
use gpuvm_sim::{CostModel, SimConfig, SimGpu};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

pub use crate::fuzz_op::{FuzzOp, MAX_OPS};
use crate::Input;

const VRAM: u64 = 1536 << 20;
/// VM 1's (the victim's) slice and RAM.
const SLICE_MIB: u64 = 64;
const GUEST_RAM: usize = 64 << 10;
/// VM 0's (the attacker's) slice and RAM: large enough for the recorded traces that seed the
/// corpus (1 GiB slices, 18 MiB of RAM); both are allocated lazily.
const ATTACKER_MIB: u64 = 128;
const ATTACKER_RAM: usize = 32 << 20;
/// VM 1's VRAM is checked in this many pages spread over its slice.
const SAMPLES: u64 = 32;

fn profile(name: &str, shadow: ShadowMode, vram_mib: u64, channels: u32) -> VgpuProfile {
    VgpuProfile {
        name: name.into(),
        vram_mib,
        channels,
        weight: 1,
        shadow,
    }
}

fn vm(host: &GpuHost, p: &VgpuProfile, ram: usize) -> (Arc<Vgpu>, GuestMemoryMmap) {
    let v = host.create_vgpu(p).expect("create_vgpu");
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), ram)]).unwrap();
    v.attach_guest_memory(mem.clone())
        .expect("attach_guest_memory");
    (v, mem)
}

/// What VM 1 owns that VM 0 must not be able to change: its sampled VRAM pages and its RAM,
/// kept whole (compared with `==`, a memcmp, which is much cheaper than hashing per input).
#[derive(Debug, PartialEq, Eq)]
struct Victim {
    vram: Vec<Vec<u8>>,
    ram: Vec<u8>,
    chans: Vec<(u32, u32)>,
}

fn snapshot(gpu: &SimGpu, v1: &Vgpu, ram1: &GuestMemoryMmap) -> Victim {
    let slice = v1.vram_slice();
    let step = slice.size / SAMPLES;
    let vram = (0..=SAMPLES)
        .map(|i| {
            let off = (i * step).min(slice.size - 4096);
            let mut page = vec![0u8; 4096];
            gpu.read_vram(HostVram(slice.base.raw() + off), &mut page);
            page
        })
        .collect();
    let mut ram = vec![0u8; GUEST_RAM];
    ram1.read_slice(&mut ram, GuestAddress(0)).unwrap();
    let chans = v1
        .phys_channels()
        .map(|c| {
            (
                gpu.read_reg(pfifo::chan_table(c)),
                gpu.read_reg(pfifo::chan_state(c)) & pfifo::STATE_START,
            )
        })
        .collect();
    Victim { vram, ram, chans }
}

/// Fills VM 1's sampled pages and its RAM with a recognisable pattern.
fn plant(gpu: &SimGpu, v1: &Vgpu, ram1: &GuestMemoryMmap) {
    let slice = v1.vram_slice();
    let step = slice.size / SAMPLES;
    for i in 0..=SAMPLES {
        let off = (i * step).min(slice.size - 4096);
        let page: Vec<u8> = (0..4096u32).map(|b| (b as u8) ^ (i as u8) ^ 0xa5).collect();
        gpu.write_vram(HostVram(slice.base.raw() + off), &page);
    }
    let ram: Vec<u8> = (0..GUEST_RAM).map(|b| (b as u8) ^ 0x5a).collect();
    ram1.write_slice(&ram, GuestAddress(0)).unwrap();
}


/// What one run did (for tests of the seed corpus; the fuzz entry point ignores it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Operations executed.
    pub ops: usize,
    /// Doorbells VM 0 rang that the device model accepted.
    pub doorbells: u64,
    /// VM 0's submissions that completed on the GPU.
    pub completions: u64,
}

/// What the host holds with only the victim alive: every input must leave it exactly so.
#[derive(Debug, PartialEq, Eq)]
struct Baseline {
    vms: usize,
    vram_free: u64,
    channels_free: u32,
    iova_free: u64,
    hypervisor_vram_used: u64,
    pending: usize,
}

impl Baseline {
    fn of(host: &GpuHost) -> Baseline {
        let s = host.stats();
        Baseline {
            vms: s.vms,
            vram_free: s.vram_free,
            channels_free: s.channels_free,
            iova_free: s.iova_free,
            hypervisor_vram_used: s.hypervisor_vram_used,
            pending: s.queued + s.inflight,
        }
    }
}

/// The host, the GPU and the victim, built once per process and reused by every input
/// ([`run`]); only the attacker (VM 0) is created and destroyed per input.
pub struct Rig {
    clock: Arc<SimClock>,
    gpu: Arc<SimGpu>,
    host: GpuHost,
    v1: Arc<Vgpu>,
    ram1: GuestMemoryMmap,
    before: Victim,
    baseline: Baseline,
    /// One per entry of `crate::seeds::checkpoint_plan`, `None` where its prefix could not
    /// be snapshotted (an input naming it starts from a fresh VM 0).
    checkpoints: Vec<Option<Checkpoint>>,
}

/// A checkpoint's cut moves forward by this share of its trace (percent) while its prefix
/// cannot be snapshotted, at most [`CUT_TRIES`] times.
const CUT_STEP_PCT: usize = 2;
const CUT_TRIES: usize = 5;

/// A started VM 0 (see the module doc): its `gpuvm::migrate` stream and the guest-RAM pages
/// its prefix wrote.
pub struct Checkpoint {
    /// Where the trace was cut: its operations before this index were replayed.
    pub cut: usize,
    stream: Vec<u8>,
    ram: Vec<(u64, Vec<u8>)>,
}

impl Rig {
    /// A 1.5 GiB simulated GF100 with the instant cost model, a host and the victim (VM 1),
    /// its sampled pages and RAM filled with a pattern.
    pub fn new() -> Rig {
        let mut rig = Rig::without_checkpoints();
        rig.checkpoints = crate::seeds::checkpoint_plan()
            .iter()
            .map(|c| {
                let step = (c.ops.len() * CUT_STEP_PCT / 100).max(1);
                (0..CUT_TRIES)
                    .map(|i| (c.cut + i * step).min(c.ops.len()))
                    .find_map(|cut| rig.checkpoint(c.mode, &c.ops[..cut]))
            })
            .collect();
        rig
    }

    /// A rig whose inputs all start from a fresh VM 0 (as before checkpoints existed).
    pub fn without_checkpoints() -> Rig {
        let clock = Arc::new(SimClock::new());
        let gpu = Arc::new(SimGpu::new(SimConfig {
            vram_size: VRAM,
            clock: clock.clone(),
            cost: CostModel::instant(),
            ..SimConfig::default()
        }));
        let host = GpuHost::new(
            gpu.clone(),
            HostConfig {
                hypervisor_vram: 32 << 20,
                ..HostConfig::default()
            },
        )
        .expect("GpuHost::new");
        let (v1, ram1) = vm(
            &host,
            &profile("victim", ShadowMode::Lazy, SLICE_MIB, 4),
            GUEST_RAM,
        );
        plant(&gpu, &v1, &ram1);
        let before = snapshot(&gpu, &v1, &ram1);
        let baseline = Baseline::of(&host);
        Rig {
            clock,
            gpu,
            host,
            v1,
            ram1,
            before,
            baseline,
            checkpoints: Vec::new(),
        }
    }

    /// For each checkpoint of the plan (bit 7 of an input's first byte selects one), where
    /// this rig cut its trace (`None`: no cut it tried could be snapshotted).
    pub fn checkpoint_cuts(&self) -> Vec<Option<usize>> {
        self.checkpoints
            .iter()
            .map(|c| c.as_ref().map(|c| c.cut))
            .collect()
    }

    /// Replays `prefix` on a fresh VM 0 and snapshots it (then destroys it: the host is back
    /// at its baseline). `None` if the snapshot is refused: a prefix that ends with a fetch or
    /// an engine operation of a channel on the GPU (a channel parked on a semaphore acquire
    /// is saved).
    fn checkpoint(&self, mode: ShadowMode, prefix: &[FuzzOp]) -> Option<Checkpoint> {
        let (v0, ram0) = vm(
            &self.host,
            &profile("attacker", mode, ATTACKER_MIB, 16),
            ATTACKER_RAM,
        );
        let mut pages = std::collections::BTreeSet::new();
        let mut destroyed = false;
        let mut summary = RunSummary::default();
        for op in prefix {
            if let FuzzOp::RamWrite { gpa, .. } = op {
                let gpa = u64::from(*gpa) % (ATTACKER_RAM as u64 - 8);
                pages.insert(gpa / 4096);
                pages.insert((gpa + 7) / 4096);
            }
            if *op != FuzzOp::Destroy {
                self.apply(&v0, &ram0, op.clone(), &mut destroyed, &mut summary);
            }
        }
        self.drain();
        let mut stream = Vec::new();
        let taken =
            gpuvm::migrate::snapshot(&self.host, &v0, &*self.clock, 10_000_000_000, &mut stream);
        let ram = pages
            .into_iter()
            .map(|p| {
                let mut page = vec![0u8; 4096];
                ram0.read_slice(&mut page, GuestAddress(p * 4096)).unwrap();
                (p, page)
            })
            .collect();
        self.host.destroy_vgpu(&v0).expect("destroy_vgpu");
        self.drain();
        self.settle();
        taken.ok().map(|_| Checkpoint {
            cut: prefix.len(),
            stream,
            ram,
        })
    }

    /// Lets whatever VM 0 started run to completion (bounded).
    fn drain(&self) {
        for _ in 0..64 {
            match self.gpu.next_event_ns() {
                Some(t) => self.clock.advance_to(t.max(self.clock.now_ns())),
                None => break,
            }
            self.host.poll();
        }
        self.host.poll();
    }

    /// Freed shadow memory leaves the quarantine once the GPU is seen idle.
    fn settle(&self) {
        for _ in 0..8 {
            if self.host.stats().hypervisor_vram_quarantined == 0 {
                break;
            }
            self.clock.advance(1_000_000);
            self.host.poll();
        }
    }

    /// VM 0 for an input: fresh in the shadow mode the first byte names, or (bit 7 set) restored
    /// from a checkpoint.
    fn attacker(&self, first: u8) -> (Arc<Vgpu>, GuestMemoryMmap) {
        let picked = match (first & 0x80 != 0, self.checkpoints.len()) {
            (true, n) if n > 0 => self.checkpoints[(first & 0x7f) as usize % n].as_ref(),
            _ => None,
        };
        if let Some(cp) = picked {
            let ram0 =
                GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), ATTACKER_RAM)]).unwrap();
            for (p, page) in &cp.ram {
                ram0.write_slice(page, GuestAddress(p * 4096)).unwrap();
            }
            let v0 = gpuvm::migrate::restore(&self.host, &cp.stream[..], Some(ram0.clone()))
                .expect("restoring a checkpoint");
            return (v0, ram0);
        }
        let mode = ShadowMode::ALL[first as usize % 4];
        vm(
            &self.host,
            &profile("attacker", mode, ATTACKER_MIB, 16),
            ATTACKER_RAM,
        )
    }

    fn apply(
        &self,
        v0: &Arc<Vgpu>,
        ram0: &GuestMemoryMmap,
        op: FuzzOp,
        destroyed: &mut bool,
        summary: &mut RunSummary,
    ) {
        let (clock, host) = (&self.clock, &self.host);
        match op {
            FuzzOp::Bar {
                bar,
                offset,
                width,
                write,
                value,
            } => access(
                v0,
                bar,
                offset,
                write,
                &value.to_le_bytes()[..width as usize],
            ),
            FuzzOp::Config {
                offset,
                width,
                write,
                value,
            } => {
                let w = width as usize;
                if write {
                    v0.config_write(offset, &value.to_le_bytes()[..w]);
                } else {
                    let mut b = [0u8; 4];
                    v0.config_read(offset, &mut b[..w]);
                }
            }
            FuzzOp::Advance { us } => {
                clock.advance(u64::from(us) * 1000);
                host.poll();
            }
            FuzzOp::RamWrite { gpa, value } => {
                let gpa = u64::from(gpa) % (ATTACKER_RAM as u64 - 8);
                ram0.write_obj(value, GuestAddress(gpa)).unwrap();
            }
            FuzzOp::Poll => v0.poll(),
            FuzzOp::Destroy => {
                if !*destroyed {
                    let s = v0.stats();
                    summary.doorbells = s.doorbells;
                    summary.completions = s.completions;
                    host.destroy_vgpu(v0).expect("destroy_vgpu");
                    *destroyed = true;
                }
            }
        }
    }

    /// One input: VM 0 (fresh, with fresh RAM) runs it, is destroyed, and the victim and the
    /// host's allocators must be as before.
    pub fn execute(&self, data: &[u8]) -> RunSummary {
        let mut inp = Input::new(data);
        let (v0, ram0) = self.attacker(inp.u8());
        let mut destroyed = false;
        let mut summary = RunSummary::default();
        while summary.ops < MAX_OPS {
            let Some(op) = FuzzOp::decode(&mut inp) else {
                break;
            };
            summary.ops += 1;
            self.apply(&v0, &ram0, op, &mut destroyed, &mut summary);
        }
        let (gpu, host) = (&self.gpu, &self.host);
        // Let whatever VM 0 started run to completion (bounded), then check, destroy, check.
        self.drain();
        assert!(
            snapshot(gpu, &self.v1, &self.ram1) == self.before,
            "VM 1 changed by VM 0's accesses"
        );
        if !destroyed {
            let s = v0.stats();
            summary.doorbells = s.doorbells;
            summary.completions = s.completions;
            host.destroy_vgpu(&v0).expect("destroy_vgpu");
        }
        host.poll();
        assert!(
            snapshot(gpu, &self.v1, &self.ram1) == self.before,
            "VM 1 changed by VM 0's teardown"
        );
        self.settle();
        assert_eq!(
            Baseline::of(host),
            self.baseline,
            "VM 0's destruction did not give everything back"
        );
        summary
    }
}

impl Default for Rig {
    fn default() -> Self {
        Rig::new()
    }
}

thread_local! {
    static RIG: Rig = Rig::new();
}

/// The fuzz entry point: one [`Rig`] per thread (libFuzzer runs one), reused by every input.
pub fn run(data: &[u8]) -> RunSummary {
    RIG.with(|rig| rig.execute(data))
}

/// The same input on a rig of its own (how every execution ran before the rig was reused; kept
/// to measure the difference and to check that reuse does not change what an input does).
pub fn run_fresh(data: &[u8]) -> RunSummary {
    Rig::without_checkpoints().execute(data)
}

fn access(v: &Vgpu, bar: Bar, off: u64, write: bool, value: &[u8]) {
    if write {
        v.bar_write(bar, off, value);
    } else {
        let mut b = [0u8; 8];
        v.bar_read(bar, off, &mut b[..value.len()]);
    }
}
