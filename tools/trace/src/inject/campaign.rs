//! The injection campaign: for each fault class, `count` injections, each one mutated trace
//! ([`super::mutate`]) replayed next to the clean ones, and the invariants of the module
//! ([`super`]) checked against a clean baseline; the counters per class ([`Summary`]).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use gpuvm::vgpu::VgpuStats;

use super::{mutate, FaultClass, Rng};
use crate::format::Trace;
use crate::replay::{Replayer, Role};

/// Counters of one fault class.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ClassResult {
    /// Injections made.
    pub injected: u64,
    /// Injections after which every invariant held.
    pub contained: u64,
    /// Injections that panicked the host.
    pub host_panics: u64,
    /// Injections after which an innocent VM's memory or fault state changed.
    pub isolation_breaches: u64,
    /// Injections after which an innocent VM lost a completion or a result.
    pub lost_completions: u64,
    /// Injections after which a resource was not given back.
    pub leaks: u64,
    /// Injections the device model noticed (violation, fault or PBDMA error on the guilty VM).
    pub detected: u64,
    /// Injections of a class that guarantees detection that went unnoticed.
    pub undetected: u64,
}

/// The campaign's result.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Per class, in [`FaultClass::ALL`] order.
    pub classes: Vec<(FaultClass, ClassResult)>,
    /// One line per failed injection (class, seed, guilty VM, mutation, what failed).
    pub failures: Vec<String>,
}

impl Summary {
    /// True if every injection was contained.
    pub fn all_contained(&self) -> bool {
        self.classes.iter().all(|(_, c)| c.contained == c.injected)
    }

    /// Totals over the classes.
    pub fn total(&self) -> ClassResult {
        let mut t = ClassResult::default();
        for (_, c) in &self.classes {
            t.injected += c.injected;
            t.contained += c.contained;
            t.host_panics += c.host_panics;
            t.isolation_breaches += c.isolation_breaches;
            t.lost_completions += c.lost_completions;
            t.leaks += c.leaks;
            t.detected += c.detected;
            t.undetected += c.undetected;
        }
        t
    }

    /// `{"classes": {"bitflip": {"injected": .., ...}, ...}, "total": {...}}`.
    pub fn json(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for (c, r) in &self.classes {
            m.insert(c.name().into(), serde_json::to_value(r).unwrap_or_default());
        }
        serde_json::json!({
            "classes": m,
            "total": self.total(),
            "failures": self.failures,
        })
    }

    /// A text table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<24} {:>8} {:>9} {:>11} {:>18} {:>16} {:>5} {:>8} {:>10}\n",
            "class",
            "injected",
            "contained",
            "host_panics",
            "isolation_breaches",
            "lost_completions",
            "leaks",
            "detected",
            "undetected"
        );
        let total = self.total();
        for (name, c) in self
            .classes
            .iter()
            .map(|(c, r)| (c.name(), r))
            .chain(std::iter::once(("total", &total)))
        {
            s += &format!(
                "{:<24} {:>8} {:>9} {:>11} {:>18} {:>16} {:>5} {:>8} {:>10}\n",
                name,
                c.injected,
                c.contained,
                c.host_panics,
                c.isolation_breaches,
                c.lost_completions,
                c.leaks,
                c.detected,
                c.undetected
            );
        }
        s
    }
}

/// Campaign settings.
#[derive(Debug, Clone)]
pub struct CampaignOptions {
    /// Classes to inject.
    pub classes: Vec<FaultClass>,
    /// Seed.
    pub seed: u64,
    /// Injections per class.
    pub count: u32,
    /// Worker threads (0: available parallelism).
    pub jobs: usize,
}

/// Per VM: (VRAM slice, guest RAM).
type Memories = Vec<(Vec<u8>, Vec<u8>)>;

/// The clean replay of a session, which every injection is compared with.
struct Baseline {
    /// Per VM: VRAM slice and guest RAM after a clean exact replay.
    mem: Memories,
    /// Per VM: sorted 8-byte word indices (VRAM, RAM) holding time-dependent values.
    mask: Vec<(Vec<u64>, Vec<u64>)>,
    /// Per VM: counters after the clean replay.
    stats: Vec<VgpuStats>,
}

fn stats_of(r: &Replayer, n: usize) -> Vec<VgpuStats> {
    (0..n)
        .map(|i| r.vgpu(i).map(|v| v.stats()).unwrap_or_default())
        .collect()
}

fn word_diffs(a: &[u8], b: &[u8]) -> Vec<u64> {
    let mut out = Vec::new();
    for (blk, (x, y)) in a.chunks(4096).zip(b.chunks(4096)).enumerate() {
        if x != y {
            for (w, (p, q)) in x.chunks(8).zip(y.chunks(8)).enumerate() {
                if p != q {
                    out.push((blk * 512 + w) as u64);
                }
            }
        }
    }
    out
}

/// The first byte offset where `cur` differs from `base` outside `mask` (word indices, counted
/// from `first_word`).
fn breach(cur: &[u8], base: &[u8], mask: &[u64], first_word: u64) -> Option<u64> {
    if cur.len() != base.len() {
        return Some(0);
    }
    for (blk, (x, y)) in cur.chunks(4096).zip(base.chunks(4096)).enumerate() {
        if x == y {
            continue;
        }
        for (w, (p, q)) in x.chunks(8).zip(y.chunks(8)).enumerate() {
            let word = first_word + (blk * 512 + w) as u64;
            if p != q && mask.binary_search(&word).is_err() {
                return Some(word * 8);
            }
        }
    }
    None
}

fn baseline(traces: &[Arc<Trace>]) -> Result<Baseline, String> {
    let n = traces.len();
    let run = |role: Role, offset: u64| -> Result<(Memories, Vec<VgpuStats>, u64), String> {
        let mut r = Replayer::new(traces.iter().map(|t| (t.clone(), role)).collect(), offset)?;
        r.run();
        r.settle();
        let mem = (0..n)
            .map(|i| {
                r.snapshot(i)
                    .ok_or("VM destroyed by its clean trace".to_string())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let stats = stats_of(&r, n);
        let rep = r.finish();
        if !rep.leaks.is_empty() {
            return Err(format!("the clean replay leaks: {:?}", rep.leaks));
        }
        Ok((mem, stats, rep.total_divergences))
    };
    let (mem, stats, div) = run(Role::Exact, 0)?;
    if div != 0 {
        return Err(format!(
            "the clean traces do not replay exactly ({div} divergences): record them together and pass every VM's trace"
        ));
    }
    let (shifted, _, div) = run(Role::Sync, 1_000_000_000)?;
    if div != 0 {
        return Err(format!(
            "the clean traces do not replay shifted in time ({div} divergences)"
        ));
    }
    let mask = mem
        .iter()
        .zip(&shifted)
        .map(|((v0, r0), (v1, r1))| (word_diffs(v0, v1), word_diffs(r0, r1)))
        .collect();
    Ok(Baseline { mem, mask, stats })
}

/// What the host did about a VM's misbehaviour. An operation aborted because its channel was
/// unbound (or the VM destroyed) while it ran counts: the teardown's engine reset cleared a
/// hang before the watchdog's deadline came.
fn detections(s: &VgpuStats) -> u64 {
    s.violations.total
        + s.faults_delivered
        + s.bar_faults
        + s.pbdma_errors_delivered
        + s.watchdog_kills
        + s.inflight_aborts
}

/// The outcome of one injection.
#[derive(Debug, Clone, Default)]
struct Outcome {
    panic: bool,
    breach: Option<String>,
    lost: Option<String>,
    leak: Option<String>,
    detected: bool,
}

fn inject_one(traces: &[Arc<Trace>], base: &Baseline, guilty: usize, mutated: Trace) -> Outcome {
    let n = traces.len();
    let mutated = Arc::new(mutated);
    let res = catch_unwind(AssertUnwindSafe(|| {
        let set = traces
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if i == guilty {
                    (mutated.clone(), Role::Guilty)
                } else {
                    (t.clone(), Role::Sync)
                }
            })
            .collect();
        let mut r = Replayer::new(set, 0).expect("the clean traces built a host");
        r.run();
        r.settle();
        // Innocent memory compared with the clean replay, outside the time-dependent words.
        let mem: Vec<Option<String>> = (0..n)
            .map(|i| {
                if i == guilty {
                    return None;
                }
                let (bv, br) = &base.mem[i];
                let (mv, mr) = &base.mask[i];
                let mut found = None;
                let ok = r.for_each_chunk(i, |vram, off, bytes| {
                    if found.is_some() {
                        return;
                    }
                    let (b, m, what) = if vram {
                        (bv, mv, "VRAM slice")
                    } else {
                        (br, mr, "guest RAM")
                    };
                    let o = off as usize;
                    let Some(base) = b.get(o..o + bytes.len()) else {
                        found = Some(format!("vm{i}: {what} has a different size"));
                        return;
                    };
                    if let Some(at) = breach(bytes, base, m, off / 8) {
                        found = Some(format!("vm{i}: {what} changed at {:#x}", off + at));
                    }
                });
                if !ok {
                    found = Some(format!("vm{i}: destroyed"));
                }
                found
            })
            .collect();
        let stats = stats_of(&r, n);
        let rep = r.finish();
        (mem, stats, rep)
    }));
    let Ok((mem, stats, rep)) = res else {
        return Outcome {
            panic: true,
            ..Outcome::default()
        };
    };
    let mut o = Outcome::default();
    let gs = match &rep.vms[guilty].stats {
        Some(s) if rep.vms[guilty].destroyed => s,
        _ => &stats[guilty],
    };
    o.detected = detections(gs) > detections(&base.stats[guilty]);
    for i in (0..n).filter(|&i| i != guilty) {
        if let Some(b) = &mem[i] {
            o.breach.get_or_insert(b.clone());
        }
        let (s, b) = (&stats[i], &base.stats[i]);
        if detections(s) != detections(b) {
            o.breach.get_or_insert(format!(
                "vm{i}: {} violations/faults/errors, {} in the clean replay",
                detections(s),
                detections(b)
            ));
        }
        if s.completions < b.completions {
            o.lost.get_or_insert(format!(
                "vm{i}: {} completions, {} in the clean replay",
                s.completions, b.completions
            ));
        }
        if rep.vms[i].mismatches > 0 {
            let d = rep
                .divergences
                .iter()
                .find(|d| d.vm == rep.vms[i].vm)
                .map(|d| d.to_string())
                .unwrap_or_default();
            o.lost.get_or_insert(format!(
                "vm{i}: {} reads never matched the recording ({d})",
                rep.vms[i].mismatches
            ));
        }
    }
    if !rep.leaks.is_empty() {
        o.leak = Some(rep.leaks.join("; "));
    }
    o
}

/// Runs a campaign over the traces of one recording session: for each class, `count`
/// injections, the guilty VM taking turns.
pub fn campaign(traces: &[Trace], opts: &CampaignOptions) -> Result<Summary, String> {
    if traces.len() < 2 {
        return Err("fault injection needs at least two VMs' traces".into());
    }
    let mut traces: Vec<Arc<Trace>> = traces.iter().cloned().map(Arc::new).collect();
    traces.sort_by_key(|t| t.header.vm);
    let base = baseline(&traces)?;
    let jobs: Vec<(FaultClass, u32)> = opts
        .classes
        .iter()
        .flat_map(|&c| (0..opts.count).map(move |k| (c, k)))
        .collect();
    let workers = if opts.jobs == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        opts.jobs
    }
    .min(jobs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Vec<(usize, Outcome, String)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(class, k)) = jobs.get(j) else {
                            break;
                        };
                        let ci = FaultClass::ALL
                            .iter()
                            .position(|&c| c == class)
                            .unwrap_or(0) as u64;
                        let mut rng =
                            Rng::new(opts.seed ^ (ci << 48) ^ (k as u64).wrapping_mul(0x9e37_79b9));
                        let guilty = (k as usize + ci as usize) % traces.len();
                        let (m, desc) = mutate(&traces[guilty], class, &mut rng);
                        let o = inject_one(&traces, &base, guilty, m);
                        out.push((
                            j,
                            o,
                            format!("{class} seed {} #{k} guilty vm{guilty}: {desc}", opts.seed),
                        ));
                    }
                    out
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut all: Vec<(usize, Outcome, String)> = results.into_iter().flatten().collect();
    all.sort_by_key(|(j, _, _)| *j);
    let mut summary = Summary::default();
    for &c in &opts.classes {
        summary.classes.push((c, ClassResult::default()));
    }
    for (j, o, desc) in all {
        let class = jobs[j].0;
        let Some((_, c)) = summary.classes.iter_mut().find(|(k, _)| *k == class) else {
            continue;
        };
        c.injected += 1;
        c.host_panics += o.panic as u64;
        c.isolation_breaches += o.breach.is_some() as u64;
        c.lost_completions += o.lost.is_some() as u64;
        c.leaks += o.leak.is_some() as u64;
        c.detected += o.detected as u64;
        let undetected = class.guarantees_detection() && !o.detected && !o.panic;
        c.undetected += undetected as u64;
        let ok =
            !o.panic && o.breach.is_none() && o.lost.is_none() && o.leak.is_none() && !undetected;
        c.contained += ok as u64;
        if !ok {
            let why = [
                o.panic.then(|| "host panic".to_string()),
                o.breach.map(|b| format!("breach: {b}")),
                o.lost.map(|l| format!("lost: {l}")),
                o.leak.map(|l| format!("leak: {l}")),
                undetected.then(|| "not detected".to_string()),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("; ");
            summary.failures.push(format!("{desc} -> {why}"));
        }
    }
    Ok(summary)
}
