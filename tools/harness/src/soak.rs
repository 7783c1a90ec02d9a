//! The soak: VMs created, run, destroyed and recreated on one simulated GPU for a given time,
//! some of them killed in the middle of their work, and at the end the checks that find leaks
//! and unfairness (`gpuvm soak`, docs/experiments.md "Soak").
//!
//! Each of `slots` threads runs *lives* back to back: create a vGPU (DMA window sized from its
//! RAM), attach fresh guest RAM, bring the unmodified guest driver up, run the workloads and
//! verify each result, release the channel, destroy the vGPU. One life in
//! [`SoakOptions::kill_one_in`] is killed instead: after a random number of its BAR writes
//! (between a tenth and all of what the slot's first, healthy life made) the vGPU is destroyed
//! under the running driver, as a crashed VMM's vGPU is; from then on its guest time stops
//! (the driver's waits return at once, [`LifeClock`]) so the dead guest gives up quickly. A
//! `companion` (the vfio-user client churn of `gpuvm soak`) runs next to the slots on the same
//! host until the same deadline.
//!
//! Checks at the end ([`SoakReport::checks`]): every workload that completed verified and none
//! failed outside a killed life; VRAM, channels, IOVA space and hypervisor VRAM back to their
//! baseline with nothing queued or in flight; RSS flat (the least-squares slope of `RssAnon`
//! over the second half of the run, extrapolated over that half, at most
//! [`SoakOptions::max_rss_growth`]); every slot's verified workloads at least
//! [`SoakOptions::min_share`] of the mean (no VM starved); no violation, watchdog kill,
//! unrouted fault, physical FIFO error or withheld partition counted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpuvm_guest::hal::Bar;
use gpuvm_guest::workloads::{self, Workload};
use gpuvm_guest::{DriverConfig, FenceMode, Gpu};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use gpuvm::clock::{Clock, ClockKind};
use gpuvm::host::{GpuHost, HostConfig, HostStats};
use gpuvm::irq::IrqLine;
use gpuvm::phys::PhysicalGpu;
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm::vgpu::Vgpu;
use gpuvm_sim::{SimConfig, SimGpu};

use crate::hal::{InProcessDevice, InProcessHal};
use crate::mem::{slope, MemSample};
use crate::virt::{host_config_for, VirtError};

/// What to soak.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// In-process VMs alive at once (one thread each).
    pub slots: usize,
    /// How long to keep creating lives (a life under way then finishes).
    pub duration: Duration,
    /// Workloads of one life, in order.
    pub workloads: Vec<Workload>,
    /// Problem size.
    pub size: u32,
    /// One life in this many is killed mid-run (0: none).
    pub kill_one_in: u32,
    /// Seed of the kill choices.
    pub seed: u64,
    /// Shadow mode of every VM.
    pub shadow: ShadowMode,
    /// VRAM slice of each in-process VM, MiB.
    pub vram_mib: u64,
    /// Channels of each in-process VM.
    pub channels: u32,
    /// Guest RAM of each in-process VM, bytes.
    pub guest_ram: u64,
    /// How often memory and the allocators are sampled.
    pub sample_every: Duration,
    /// Every slot must verify at least this fraction of the mean slot's workloads.
    pub min_share: f64,
    /// Largest RSS growth (`RssAnon`) tolerated over the second half of the run, bytes.
    pub max_rss_growth: u64,
    /// The guest driver's timeout for one wait, ns.
    pub driver_timeout_ns: u64,
}

impl Default for SoakOptions {
    fn default() -> Self {
        SoakOptions {
            slots: 4,
            duration: Duration::from_secs(10),
            workloads: vec![Workload::Mmul, Workload::MemcpyHtod, Workload::Madd],
            size: 64,
            kill_one_in: 4,
            seed: 1,
            shadow: ShadowMode::Incremental,
            vram_mib: 64,
            channels: 4,
            guest_ram: 18 << 20,
            sample_every: Duration::from_millis(500),
            min_share: 0.5,
            max_rss_growth: 16 << 20,
            driver_timeout_ns: 2_000_000_000,
        }
    }
}

/// A simulated GPU and its host, sized for `vms` VMs in total.
pub struct SoakRig {
    /// The host.
    pub host: Arc<GpuHost>,
    /// The simulated GPU.
    pub sim: Arc<SimGpu>,
    /// Its clock.
    pub clock: Arc<dyn Clock>,
}

impl SoakRig {
    /// A 6 GiB simulated GF100 on `clock` with enough hypervisor VRAM for `vms` VMs.
    pub fn new(vms: usize, clock: ClockKind) -> Result<SoakRig, VirtError> {
        let clock = clock.create();
        let sim = Arc::new(SimGpu::new(SimConfig {
            vram_size: 6 << 30,
            clock: clock.clone(),
            ..SimConfig::default()
        }));
        let phys: Arc<dyn PhysicalGpu> = sim.clone();
        let host = GpuHost::new(phys, host_config_for(&HostConfig::default(), vms))?;
        host.set_clock(clock.clone());
        Ok(SoakRig {
            host: Arc::new(host),
            sim,
            clock,
        })
    }
}

/// What the allocators hold (compared at the start and the end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Baseline {
    /// VMs alive.
    pub vms: usize,
    /// VRAM not assigned to a VM, bytes.
    pub vram_free: u64,
    /// Channels not assigned.
    pub channels_free: u32,
    /// IOVA space not held by a DMA window, bytes.
    pub iova_free: u64,
    /// Hypervisor VRAM in use, bytes.
    pub hypervisor_vram_used: u64,
    /// Submissions queued or in flight.
    pub pending: usize,
}

impl Baseline {
    fn of(s: &HostStats) -> Baseline {
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

/// One sample during the run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sample {
    /// Since the start, ms.
    pub t_ms: u64,
    /// Host memory.
    pub mem: MemSample,
    /// VMs alive (in-process and companion).
    pub vms: usize,
    /// Lives finished so far (in-process).
    pub lives: u64,
    /// Workloads verified so far (in-process).
    pub verified: u64,
}

/// One slot's totals.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SlotReport {
    /// Lives run.
    pub lives: u64,
    /// Of them, killed mid-run.
    pub killed: u64,
    /// Workloads completed and verified.
    pub verified: u64,
    /// Workloads cut short by a kill (not counted as failures).
    pub cut_by_kill: u64,
    /// Verified workloads over the mean slot's.
    pub share: f64,
}

/// The result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SoakReport {
    /// Wall time from the start to the end check, ns.
    pub wall_ns: u64,
    /// Per slot.
    pub slots: Vec<SlotReport>,
    /// Samples, every [`SoakOptions::sample_every`].
    pub samples: Vec<Sample>,
    /// Allocators at the start.
    pub baseline: Baseline,
    /// Allocators at the end.
    pub end: Baseline,
    /// Slope of `RssAnon` over the second half, bytes per minute.
    pub rss_slope_per_min: f64,
    /// That slope over the second half's length, bytes.
    pub rss_growth_second_half: f64,
    /// `RssAnon` at the first and the last sample, bytes.
    pub rss_anon_first_last: (u64, u64),
    /// Smallest slot share.
    pub min_share: f64,
    /// Violations, watchdog kills, unrouted faults, FIFO errors and withheld partitions.
    pub violations: u64,
    /// What went wrong that should not have (empty when all is well).
    pub unexpected: Vec<String>,
    /// Each check by name and whether it passed.
    pub checks: Vec<(String, bool)>,
}

impl SoakReport {
    /// True if every check passed.
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.1)
    }
}

/// Progress, for a progress bar: elapsed, lives finished, workloads verified, lives killed.
pub type OnProgress<'a> = dyn Fn(Duration, u64, u64, u64) + Sync + 'a;

/// A life's vGPU, destroyed by the HAL itself after `kill_at` BAR writes.
struct Killable {
    vgpu: Arc<Vgpu>,
    host: Arc<GpuHost>,
    writes: AtomicU64,
    kill_at: Option<u64>,
    killed: Arc<AtomicBool>,
}

impl InProcessDevice for Killable {
    fn bar_read(&self, bar: Bar, offset: u64, data: &mut [u8]) {
        self.vgpu.bar_read(bar, offset, data);
    }
    fn bar_write(&self, bar: Bar, offset: u64, data: &[u8]) {
        let n = self.writes.fetch_add(1, Ordering::Relaxed) + 1;
        if self.kill_at == Some(n) {
            self.killed.store(true, Ordering::SeqCst);
            if let Err(e) = self.host.destroy_vgpu(&self.vgpu) {
                log::warn!("soak: killing {}: {e}", self.vgpu.id());
            }
        }
        self.vgpu.bar_write(bar, offset, data);
    }
    fn poll(&self) {
        self.vgpu.poll();
    }
    fn next_event_ns(&self) -> Option<u64> {
        self.vgpu.next_event_ns()
    }
    fn set_irq_line(&self, line: Arc<dyn IrqLine>) {
        self.vgpu.set_irq_line(line);
    }
}

/// The clock a life's driver sees: the GPU's, until the life is killed; then a dead guest's,
/// whose waits return at once.
#[derive(Debug)]
pub struct LifeClock {
    inner: Arc<dyn Clock>,
    killed: Arc<AtomicBool>,
}

impl Clock for LifeClock {
    fn now_ns(&self) -> u64 {
        let dead = if self.killed.load(Ordering::Relaxed) {
            1 << 50
        } else {
            0
        };
        self.inner.now_ns().saturating_add(dead)
    }
    fn wait_ns(&self, ns: u64) {
        if !self.killed.load(Ordering::Relaxed) {
            self.inner.wait_ns(ns);
        }
    }
    fn is_simulated(&self) -> bool {
        self.inner.is_simulated()
    }
}

/// A small deterministic generator (splitmix64).
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Counters shared by the slots.
#[derive(Default)]
struct Shared {
    lives: AtomicU64,
    verified: AtomicU64,
    killed: AtomicU64,
    violations: AtomicU64,
    unexpected: Mutex<Vec<String>>,
}

impl Shared {
    fn unexpected(&self, what: String) {
        log::error!("soak: {what}");
        self.unexpected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(what);
    }
}

/// Runs the soak on `rig`; `companion(deadline)` runs in its own thread until the deadline and
/// must leave the host as it found it before returning.
pub fn run_soak(
    rig: &SoakRig,
    opts: &SoakOptions,
    companion: &(dyn Fn(Instant) + Sync),
    progress: &OnProgress,
) -> Result<SoakReport, VirtError> {
    if opts.slots == 0 || opts.workloads.is_empty() {
        return Err(VirtError::Options(
            "a soak needs at least one slot and one workload".into(),
        ));
    }
    let start = Instant::now();
    let deadline = start + opts.duration;
    let baseline = Baseline::of(&rig.host.stats());
    let shared = Shared::default();
    let samples = Mutex::new(Vec::new());
    let done = AtomicBool::new(false);
    let slots: Vec<SlotReport> = std::thread::scope(|s| {
        let comp = s.spawn(|| companion(deadline));
        let sampler = s.spawn(|| loop {
            let st = rig.host.stats();
            let sample = Sample {
                t_ms: start.elapsed().as_millis() as u64,
                mem: MemSample::now(Some(&rig.sim)),
                vms: st.vms,
                lives: shared.lives.load(Ordering::Relaxed),
                verified: shared.verified.load(Ordering::Relaxed),
            };
            progress(
                start.elapsed(),
                sample.lives,
                sample.verified,
                shared.killed.load(Ordering::Relaxed),
            );
            samples
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(sample);
            let until = Instant::now() + opts.sample_every;
            while Instant::now() < until {
                if done.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20).min(opts.sample_every));
            }
        });
        let handles: Vec<_> = (0..opts.slots)
            .map(|slot| {
                let shared = &shared;
                s.spawn(move || run_slot(rig, opts, slot, deadline, shared))
            })
            .collect();
        let slots = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a soak slot panicked")))
            .collect();
        if comp.join().is_err() {
            shared.unexpected("the companion panicked".into());
        }
        done.store(true, Ordering::SeqCst);
        let _ = sampler.join();
        slots
    });
    // Let the quarantine of freed hypervisor VRAM drain (the GPU has to be seen idle).
    let settle = Instant::now();
    while rig.host.stats().hypervisor_vram_quarantined > 0
        && settle.elapsed() < Duration::from_secs(2)
    {
        rig.clock.wait_ns(1_000_000);
        rig.host.poll();
    }
    let end_stats = rig.host.stats();
    let end = Baseline::of(&end_stats);
    let mut samples = samples.into_inner().unwrap_or_else(|p| p.into_inner());
    samples.push(Sample {
        t_ms: start.elapsed().as_millis() as u64,
        mem: MemSample::now(Some(&rig.sim)),
        vms: end.vms,
        lives: shared.lives.load(Ordering::Relaxed),
        verified: shared.verified.load(Ordering::Relaxed),
    });
    Ok(finish(
        opts, start, slots, samples, baseline, end, &end_stats, shared,
    ))
}

/// The checks.
#[allow(clippy::too_many_arguments)]
fn finish(
    opts: &SoakOptions,
    start: Instant,
    mut slots: Vec<SlotReport>,
    samples: Vec<Sample>,
    baseline: Baseline,
    end: Baseline,
    end_stats: &HostStats,
    shared: Shared,
) -> SoakReport {
    let mean = slots.iter().map(|s| s.verified as f64).sum::<f64>() / slots.len().max(1) as f64;
    for s in &mut slots {
        s.share = if mean > 0.0 {
            s.verified as f64 / mean
        } else {
            0.0
        };
    }
    let min_share = slots.iter().map(|s| s.share).fold(f64::INFINITY, f64::min);
    let half = samples.last().map_or(0, |s| s.t_ms) / 2;
    let second: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.t_ms >= half)
        .map(|s| (s.t_ms as f64 / 60_000.0, s.mem.rss_anon as f64))
        .collect();
    let slope_per_min = slope(&second).unwrap_or(0.0);
    let growth = slope_per_min * (half as f64 / 60_000.0);
    let host_bad = end_stats.watchdog_kills
        + end_stats.unrouted
        + end_stats.phys_fifo_errors
        + end_stats.withheld_partitions;
    let violations = shared.violations.load(Ordering::Relaxed) + host_bad;
    let unexpected = shared
        .unexpected
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    let verified: u64 = slots.iter().map(|s| s.verified).sum();
    let checks = vec![
        (
            "every completed workload verified".to_string(),
            unexpected.is_empty() && verified > 0,
        ),
        (
            "VRAM, channels, IOVA and hypervisor VRAM back to baseline, nothing pending"
                .to_string(),
            end == baseline,
        ),
        (
            format!(
                "RSS flat: growth over the second half <= {} MiB",
                opts.max_rss_growth >> 20
            ),
            growth <= opts.max_rss_growth as f64,
        ),
        (
            format!(
                "no VM starved: every slot >= {:.0} % of the mean slot's verified workloads",
                opts.min_share * 100.0
            ),
            min_share >= opts.min_share,
        ),
        ("no unexpected violation".to_string(), violations == 0),
    ];
    SoakReport {
        wall_ns: start.elapsed().as_nanos() as u64,
        slots,
        rss_anon_first_last: (
            samples.first().map_or(0, |s| s.mem.rss_anon),
            samples.last().map_or(0, |s| s.mem.rss_anon),
        ),
        samples,
        baseline,
        end,
        rss_slope_per_min: slope_per_min,
        rss_growth_second_half: growth,
        min_share,
        violations,
        unexpected,
        checks,
    }
}

/// One slot: lives until the deadline.
fn run_slot(
    rig: &SoakRig,
    opts: &SoakOptions,
    slot: usize,
    deadline: Instant,
    shared: &Shared,
) -> SlotReport {
    let mut rng = opts.seed ^ (slot as u64).wrapping_mul(0x1000_0000_01b3);
    let mut rep = SlotReport::default();
    let mut healthy_writes = 0u64;
    let profile = VgpuProfile {
        name: format!("soak{slot}"),
        vram_mib: opts.vram_mib,
        channels: opts.channels,
        weight: 1,
        shadow: opts.shadow,
    };
    let ram_len = opts.guest_ram as usize;
    while Instant::now() < deadline {
        let life = rep.lives;
        rep.lives += 1;
        let vgpu = match rig.host.create_vgpu_for_ram(&profile, opts.guest_ram) {
            Ok(v) => v,
            Err(e) => {
                shared.unexpected(format!("slot {slot} life {life}: create: {e}"));
                break;
            }
        };
        let mem = match GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), ram_len)]) {
            Ok(m) => m,
            Err(e) => {
                shared.unexpected(format!("slot {slot}: guest RAM: {e}"));
                let _ = rig.host.destroy_vgpu(&vgpu);
                break;
            }
        };
        if let Err(e) = vgpu.attach_guest_memory(mem.clone()) {
            shared.unexpected(format!("slot {slot} life {life}: attach: {e}"));
            let _ = rig.host.destroy_vgpu(&vgpu);
            break;
        }
        let r = next(&mut rng);
        let kill_at = (opts.kill_one_in > 0
            && healthy_writes > 10
            && r.is_multiple_of(u64::from(opts.kill_one_in)))
        .then(|| healthy_writes / 10 + next(&mut rng) % (healthy_writes * 9 / 10));
        let killed = Arc::new(AtomicBool::new(false));
        let dev = Killable {
            vgpu: vgpu.clone(),
            host: rig.host.clone(),
            writes: AtomicU64::new(0),
            kill_at,
            killed: killed.clone(),
        };
        let clock: Arc<dyn Clock> = Arc::new(LifeClock {
            inner: rig.clock.clone(),
            killed: killed.clone(),
        });
        let hal = InProcessHal::with_device(dev, clock, mem, 0, opts.guest_ram);
        let cfg = DriverConfig {
            fence_mode: FenceMode::Poll,
            timeout_ns: opts.driver_timeout_ns,
            ..DriverConfig::default()
        };
        let was_killed = || killed.load(Ordering::SeqCst);
        match Gpu::init(hal, cfg) {
            Ok(mut drv) => {
                for (i, &w) in opts.workloads.iter().enumerate() {
                    match workloads::run(&mut drv, w, opts.size) {
                        Ok(r) if r.verified => {
                            rep.verified += 1;
                            shared.verified.fetch_add(1, Ordering::Relaxed);
                        }
                        _ if was_killed() => {
                            rep.cut_by_kill += (opts.workloads.len() - i) as u64;
                            break;
                        }
                        Ok(_) => shared.unexpected(format!(
                            "slot {slot} life {life}: {} did not verify",
                            w.name()
                        )),
                        Err(e) => {
                            shared.unexpected(format!("slot {slot} life {life}: {}: {e}", w.name()))
                        }
                    }
                }
                let _ = workloads::release_channel(&mut drv);
                if kill_at.is_none() {
                    healthy_writes = drv.hal().device().writes.load(Ordering::Relaxed);
                }
            }
            Err(_) if was_killed() => rep.cut_by_kill += opts.workloads.len() as u64,
            Err(e) => shared.unexpected(format!("slot {slot} life {life}: driver init: {e}")),
        }
        if was_killed() {
            rep.killed += 1;
            shared.killed.fetch_add(1, Ordering::Relaxed);
        } else {
            let v = vgpu.stats().violations.total;
            shared.violations.fetch_add(v, Ordering::Relaxed);
            if v > 0 {
                shared.unexpected(format!("slot {slot} life {life}: {v} violations"));
            }
            if let Err(e) = rig.host.destroy_vgpu(&vgpu) {
                shared.unexpected(format!("slot {slot} life {life}: destroy: {e}"));
            }
        }
        shared.lives.fetch_add(1, Ordering::Relaxed);
    }
    rep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_spreads_kills() {
        let mut s = 1;
        let kills = (0..4000).filter(|_| next(&mut s).is_multiple_of(4)).count();
        assert!((800..1200).contains(&kills), "{kills}");
    }
}
