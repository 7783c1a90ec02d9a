//! Recorded traces (issue 6): the corpus in `tests/traces/` replays exactly, and a bounded
//! fault-injection campaign (every class, fixed seeds, > 2,000 injections) reports no host
//! panic, no isolation breach, no lost completion and no leak — while the same campaign with a
//! planted bug (the VRAM-slice bounds check disabled) reports breaches, showing the checker can
//! fail.
//!
//! The tests of this file share a lock: the planted bug is a process-wide switch.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Instant;

use gpuvm::guest_mem::PLANTED_BUG_NO_SLICE_CHECK;
use gpuvm_trace::format;
use gpuvm_trace::inject::{self, CampaignOptions, FaultClass};
use gpuvm_trace::replay;
use gpuvm_trace::Trace;

static LOCK: Mutex<()> = Mutex::new(());

fn traces_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/traces")
}

fn load(set: &str) -> Vec<Trace> {
    let dir = traces_dir().join(set);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| format::read_file(f).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

fn sets() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(traces_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn corpus_covers_every_mode_and_replays_exactly() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut modes = std::collections::BTreeSet::new();
    let mut vm_counts = std::collections::BTreeSet::new();
    for set in sets() {
        let traces = load(&set);
        assert!(!traces.is_empty(), "{set}");
        let h = &traces[0].header;
        assert_eq!(traces.len() as u32, h.vms, "{set}: every VM's trace");
        modes.insert(h.profile.shadow.to_string());
        vm_counts.insert(h.vms);
        let r = replay::replay(traces, true).unwrap();
        for d in &r.divergences {
            eprintln!("{set}: {d}");
        }
        assert_eq!(r.total_divergences, 0, "{set}: replay diverged");
        assert!(r.leaks.is_empty(), "{set}: {:?}", r.leaks);
        for v in &r.vms {
            assert!(v.reads > 0 && v.mismatches == 0, "{set}: {v:?}");
            let s = v.stats.as_ref().unwrap();
            assert_eq!(s.violations.total, 0, "{set}");
            assert!(s.completions > 0, "{set}");
        }
    }
    assert_eq!(
        modes.into_iter().collect::<Vec<_>>(),
        ["eager", "incremental", "lazy", "pv"]
    );
    assert!(vm_counts.contains(&1) && vm_counts.contains(&4));
}

#[test]
fn a_changed_read_is_reported_with_line_register_and_values() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut t = load("1vm-lazy");
    // Pretend BOOT_0 read something else.
    let e = t[0]
        .events
        .iter_mut()
        .find(|e| matches!(e.op, format::Op::Read { offset: 0, .. }))
        .unwrap();
    let line = e.line;
    if let format::Op::Read { value, .. } = &mut e.op {
        *value ^= 1;
    }
    let r = replay::replay(t, true).unwrap();
    assert_eq!(r.total_divergences, 1);
    let d = &r.divergences[0];
    assert_eq!(d.line, line);
    assert!(d.what.contains("PMC.BOOT_0"), "{d}");
    assert_eq!(
        (d.expected.as_str(), d.got.as_str()),
        ("0xc0c00a2", "0xc0c00a3")
    );
}

/// The CI campaign: 21 classes x 112 injections = 2,352 (the parked-acquire class included), fixed seed, two traces of one
/// recording (the guilty VM alternates); the hung-engine class, whose injections each run the
/// GPU to the watchdog's deadline, has its own smaller campaign below.
#[test]
fn campaign_contains_every_fault() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let traces = load("2vm-campaign");
    let start = Instant::now();
    let s = inject::campaign(
        &traces,
        &CampaignOptions {
            classes: FaultClass::ALL
                .into_iter()
                .filter(|&c| c != FaultClass::HungEngine)
                .collect(),
            seed: 0x6_2026,
            count: 112,
            jobs: 0,
        },
    )
    .unwrap();
    println!(
        "fault-injection campaign ({:.1} s):\n{}",
        start.elapsed().as_secs_f64(),
        s.table()
    );
    for f in &s.failures {
        println!("FAILED {f}");
    }
    let t = s.total();
    assert!(t.injected >= 2000, "{}", t.injected);
    assert_eq!(
        (
            t.host_panics,
            t.isolation_breaches,
            t.lost_completions,
            t.leaks,
            t.undetected
        ),
        (0, 0, 0, 0, 0)
    );
    assert!(s.all_contained());
    // Channels parked for good on an acquire were kept off the engines without costing the
    // innocent VM anything.
    let parked = s
        .classes
        .iter()
        .find(|(c, _)| *c == FaultClass::ParkedAcquire)
        .map(|(_, r)| r.clone())
        .expect("the parked-acquire class ran");
    assert_eq!(parked.injected, 112);
    assert_eq!(parked.contained, parked.injected);
    // Every class did something the device model noticed at least once, except the ones
    // whose mutations are legal accesses as often as not.
    for (c, r) in &s.classes {
        if c.guarantees_detection() {
            assert_eq!(r.detected, r.injected, "{c}");
        }
    }
}

/// A hung engine (a compute launch made a 2^60-iteration loop): the watchdog kills the guilty
/// VM's channel every time, and the innocent VM loses nothing.
///
/// (This once failed when the innocent VM's own submission, waiting behind a hang the scheduler did not
/// account, reached its deadline first and was killed instead: in-flight deadlines now wait
/// while an engine runs unaccounted work.)
#[test]
fn hung_engine_is_contained_by_the_watchdog() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let traces = load("2vm-campaign");
    let s = inject::campaign(
        &traces,
        &CampaignOptions {
            classes: vec![FaultClass::HungEngine],
            seed: 0x6_2026,
            count: 16,
            jobs: 0,
        },
    )
    .unwrap();
    println!("hung-engine campaign:\n{}", s.table());
    for f in &s.failures {
        println!("FAILED {f}");
    }
    let t = s.total();
    assert_eq!(t.injected, 16);
    assert_eq!(
        (
            t.host_panics,
            t.isolation_breaches,
            t.lost_completions,
            t.leaks
        ),
        (0, 0, 0, 0)
    );
    assert!(s.all_contained());
    assert_eq!(
        t.detected, t.injected,
        "every hang is killed by the watchdog"
    );
}

/// The checker can fail: with the VRAM-slice check disabled, out-of-slice page-table entries,
/// instance blocks and PRAMIN windows reach the next VM's slice, and the campaign says so.
#[test]
fn planted_bug_is_caught() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let traces = load("2vm-campaign");
    PLANTED_BUG_NO_SLICE_CHECK.store(true, Ordering::SeqCst);
    let s = inject::campaign(
        &traces,
        &CampaignOptions {
            classes: vec![
                FaultClass::OobWindow,
                FaultClass::OobPte,
                FaultClass::OobPde,
            ],
            seed: 11,
            count: 16,
            jobs: 0,
        },
    );
    PLANTED_BUG_NO_SLICE_CHECK.store(false, Ordering::SeqCst);
    let s = s.unwrap();
    println!("with the planted bug:\n{}", s.table());
    for f in s.failures.iter().take(5) {
        println!("FAILED {f}");
    }
    let t = s.total();
    assert!(t.isolation_breaches > 0, "the planted bug went unnoticed");
    assert!(!s.all_contained());
}
