//! Scripted tests of every rule of every policy (exact decision sequences) and property tests
//! over random workloads on the mock GPU of [`super::sim`].

use proptest::prelude::*;

use super::sim::{sub, Ev, Guest, MockGpu};
use super::*;

const US: u64 = 1_000;
const MS: u64 = 1_000_000;

use Decision::{Dispatch, Idle, WaitUntil};

fn credit(vm: &dyn Scheduler, v: u32) -> i64 {
    vm.snapshot()
        .vms
        .iter()
        .find(|p| p.vm == VmId(v))
        .and_then(|p| p.credit_ns)
        .expect("credit")
}

fn util(vm: &dyn Scheduler, v: u32) -> u32 {
    vm.snapshot()
        .vms
        .iter()
        .find(|p| p.vm == VmId(v))
        .and_then(|p| p.util_ppm)
        .expect("util")
}

fn order(vm: &dyn Scheduler) -> Vec<u32> {
    let snap = vm.snapshot();
    let mut v: Vec<(usize, u32)> = snap
        .vms
        .iter()
        .map(|p| (p.position.expect("position"), p.vm.0))
        .collect();
    v.sort();
    v.into_iter().map(|x| x.1).collect()
}

fn two(policy: Policy, params: SchedParams) -> Box<dyn Scheduler> {
    let mut s = policy.create(&params);
    s.add_vm(VmId(0), 1, 0);
    s.add_vm(VmId(1), 1, 0);
    s
}

#[test]
fn dispatch_rules() {
    let s = |vm: u32, ch: u32| sub(vm, ch, 1);
    assert!(dispatchable(&s(0, 0), &[], 1));
    assert!(!dispatchable(&s(0, 0), &[], 0));
    assert!(
        !dispatchable(&s(1, 0), &[s(0, 0)], 4),
        "two VMs never overlap"
    );
    assert!(!dispatchable(&s(0, 0), &[s(0, 0)], 4), "one per channel");
    assert!(dispatchable(&s(0, 1), &[s(0, 0)], 4));
    assert!(!dispatchable(&s(0, 1), &[s(0, 0)], 1));
    assert_eq!(VmId(3).to_string(), "vm3");
}

#[test]
fn policies_by_name() {
    for p in Policy::EVERY {
        assert_eq!(p.name().parse::<Policy>(), Ok(p));
        assert_eq!(p.to_string(), p.name());
        assert_eq!(by_name(p.name()).unwrap().name(), p.name());
        assert_eq!(p.create(&SchedParams::default()).name(), p.name());
    }
    assert!(by_name("lottery").is_none());
    let e = "lottery".parse::<Policy>().unwrap_err();
    assert!(e.contains("fifo, credit, band, band-gdev"), "{e}");
    assert_eq!(share_ppm(1, 3), 333_333);
    assert_eq!(share_ppm(1, 0), 0);
}

#[test]
fn params_defaults_serde_and_validation() {
    let p = SchedParams::default();
    assert_eq!(p.period_ns, 30 * MS);
    assert_eq!(p.credit_limit_ns, 30 * MS);
    assert_eq!(p.util_window_ns, 1_000 * MS);
    assert_eq!(p.wait_ns, 500 * US);
    assert_eq!(p.wait_chances, 1);
    assert!(!p.arrival_yield);
    assert_eq!(p.credit_bound, CreditBound::Clamp);
    assert!(p.adaptive_wait && p.util_of_busy && p.requeue_on_lost_wait);
    assert_eq!(
        (p.wait_max_ns, p.wait_margin_pct, p.wait_max_ratio),
        (10 * MS, 150, 5)
    );
    assert_eq!(p.validate(), Ok(()));
    let t: SchedParams = toml::from_str("wait_ns = 250000\ncredit_bound = \"zero\"").unwrap();
    assert_eq!(t.wait_ns, 250 * US);
    assert_eq!(t.credit_bound, CreditBound::Zero);
    assert_eq!(t.period_ns, 30 * MS, "the rest defaults");
    assert!(toml::from_str::<SchedParams>("perod_ns = 1").is_err());
    let back: SchedParams = toml::from_str(&toml::to_string(&p).unwrap()).unwrap();
    assert_eq!(back, p);
    for bad in [
        SchedParams {
            period_ns: 0,
            ..p.clone()
        },
        SchedParams {
            util_window_ns: 0,
            ..p.clone()
        },
        SchedParams {
            wait_chances: 0,
            ..p.clone()
        },
        SchedParams {
            credit_limit_ns: u64::MAX,
            ..p.clone()
        },
        SchedParams {
            wait_max_ns: 100 * US,
            ..p.clone()
        },
        SchedParams {
            wait_max_ratio: 0,
            ..p.clone()
        },
        SchedParams {
            wait_margin_pct: 50,
            ..p.clone()
        },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
}

// ---------------------------------------------------------------- FIFO

#[test]
fn fifo_is_arrival_order_with_head_of_line_blocking() {
    let mut f = Policy::Fifo.create(&SchedParams::default());
    f.add_vm(VmId(0), 1, 0);
    f.add_vm(VmId(1), 5, 0);
    f.submit(sub(0, 0, 1), 0);
    f.submit(sub(1, 0, 1), 0);
    f.submit(sub(0, 1, 1), 0);
    assert_eq!(f.decide(&[], 4, 0), Dispatch(sub(0, 0, 1)));
    // vm1 is next; it may not overlap vm0, and vm0's second channel may not overtake it.
    assert_eq!(f.decide(&[sub(0, 0, 1)], 4, 0), Idle);
    f.submit(sub(0, 0, 2), 1);
    assert_eq!(f.decide(&[], 4, 2), Dispatch(sub(1, 0, 1)));
    assert_eq!(f.decide(&[sub(1, 0, 1)], 4, 2), Idle);
    assert_eq!(f.decide(&[], 4, 3), Dispatch(sub(0, 1, 1)));
    assert_eq!(f.decide(&[sub(0, 1, 1)], 4, 3), Dispatch(sub(0, 0, 2)));
    assert_eq!(f.decide(&[], 4, 3), Idle);
    assert_eq!(f.next_tick_ns(), None, "no periods");
    let snap = f.snapshot();
    assert_eq!(snap.vms[1].share_ppm, 833_333);
    assert_eq!(snap.vms[1].credit_ns, None);
}

// ---------------------------------------------------------------- credits and periods

#[test]
fn credit_is_replenished_every_period_and_clamped() {
    for policy in [Policy::Credit, Policy::Band] {
        let mut c = policy.create(&SchedParams::default());
        c.add_vm(VmId(0), 1, 0);
        // Alone, vm0 starts with a whole period; vm1 with its share of one (1/4).
        assert_eq!(credit(&*c, 0), 30 * MS as i64);
        c.add_vm(VmId(1), 3, 0);
        assert_eq!(credit(&*c, 1), 22_500_000);
        assert_eq!(c.next_tick_ns(), Some(30 * MS));
        c.complete(&sub(0, 0, 1), 10 * MS, 20 * MS);
        assert_eq!(credit(&*c, 0), 10 * MS as i64);
        c.tick(30 * MS);
        assert_eq!(credit(&*c, 0), 17_500_000, "+ period x 1/4");
        assert_eq!(credit(&*c, 1), 30 * MS as i64, "45 ms clamped to +period");
        c.tick(60 * MS - 1);
        assert_eq!(credit(&*c, 0), 17_500_000, "no tick before the period ends");
        c.tick(60 * MS);
        assert_eq!(credit(&*c, 0), 25 * MS as i64);
        c.tick(90 * MS);
        assert_eq!(credit(&*c, 0), 30 * MS as i64, "32.5 ms clamped");
        c.complete(&sub(1, 0, 1), 95 * MS, 100 * MS);
        assert_eq!(credit(&*c, 1), -70 * MS as i64, "no bound between ticks");
        // A late event processes the missed tick at its own time first.
        c.submit(sub(0, 0, 2), 125 * MS);
        assert_eq!(
            credit(&*c, 1),
            -30 * MS as i64,
            "-47.5 ms clamped to -period"
        );
        assert_eq!(c.next_tick_ns(), Some(150 * MS));
        assert_eq!(c.snapshot().ticks, 4);
    }
}

#[test]
fn gdev_zeroes_credits_beyond_the_bound() {
    let p = SchedParams {
        credit_bound: CreditBound::Zero,
        ..SchedParams::default()
    };
    let mut c = Policy::Credit.create(&p);
    c.add_vm(VmId(0), 1, 0);
    c.add_vm(VmId(1), 3, 0);
    c.complete(&sub(0, 0, 1), 10 * MS, 20 * MS);
    c.tick(30 * MS);
    assert_eq!(credit(&*c, 0), 17_500_000);
    assert_eq!(credit(&*c, 1), 0, "45 ms > 30 ms: all credit taken away");
    c.tick(90 * MS);
    assert_eq!(credit(&*c, 0), 0, "32.5 ms > 30 ms");
    assert_eq!(credit(&*c, 1), 0, "22.5 then 45 ms");
    c.complete(&sub(1, 0, 1), 95 * MS, 100 * MS);
    c.tick(120 * MS);
    assert_eq!(credit(&*c, 1), 0, "-77.5 ms < -30 ms: zeroed");
}

#[test]
fn utilisation_over_the_window_restarts_every_second() {
    let mut b = two(Policy::Band, SchedParams::default());
    b.complete(&sub(0, 0, 1), 20 * MS, 15 * MS);
    assert_eq!(util(&*b, 0), 0, "measured at ticks only");
    b.tick(30 * MS);
    assert_eq!(util(&*b, 0), 500_000, "15 of 30 ms");
    assert_eq!(util(&*b, 1), 0);
    b.tick(60 * MS);
    assert_eq!(util(&*b, 0), 250_000, "15 of 60 ms");
    b.complete(&sub(0, 0, 2), 70 * MS, 30 * MS);
    b.tick(90 * MS);
    assert_eq!(util(&*b, 0), 500_000, "45 of 90 ms");
    b.tick(990 * MS);
    assert_eq!(util(&*b, 0), 45_454, "45 of 990 ms");
    b.tick(1020 * MS);
    assert_eq!(
        util(&*b, 0),
        44_117,
        "45 of 1020 ms, then the window restarts"
    );
    b.tick(1050 * MS);
    assert_eq!(util(&*b, 0), 0, "0 of 30 ms");
    b.complete(&sub(0, 0, 3), 1060 * MS, 30 * MS);
    b.tick(1080 * MS);
    assert_eq!(util(&*b, 0), 500_000, "30 of 60 ms");
    b.complete(&sub(0, 0, 4), 1090 * MS, 500 * MS);
    b.tick(1110 * MS);
    assert_eq!(util(&*b, 0), 1_000_000, "capped at 100 %");
}

// ---------------------------------------------------------------- demotion

/// vm0 runs a 40 ms kernel (its credit goes negative before any tick measured its utilisation),
/// then vm1 a 10 ms and a 40 ms one; both keep one more submission queued.
fn demotion_script(policy: Policy) -> Vec<(Decision, Vec<u32>)> {
    let mut s = two(policy, SchedParams::default());
    let mut out = Vec::new();
    let mut step = |s: &mut Box<dyn Scheduler>, inflight: &[Submission], t: u64| {
        let d = s.decide(inflight, 4, t);
        out.push((d, order(&**s)));
        d
    };
    s.submit(sub(0, 0, 1), 0);
    s.submit(sub(1, 0, 1), 0);
    step(&mut s, &[], 0);
    s.submit(sub(0, 0, 2), 0);
    step(&mut s, &[sub(0, 0, 1)], 0);
    s.complete(&sub(0, 0, 1), 40 * MS, 40 * MS);
    let d = step(&mut s, &[], 40 * MS);
    let Dispatch(x) = d else { return out };
    s.submit(sub(x.vm.0, 0, x.put + 1), 40 * MS);
    s.complete(&x, 50 * MS, 10 * MS);
    let d = step(&mut s, &[], 50 * MS);
    let Dispatch(y) = d else { return out };
    s.complete(&y, 90 * MS, 40 * MS);
    step(&mut s, &[], 90 * MS);
    out
}

#[test]
fn credit_demotes_whenever_credit_is_exhausted() {
    let got = demotion_script(Policy::Credit);
    assert_eq!(
        got,
        vec![
            (Dispatch(sub(0, 0, 1)), vec![0, 1]),
            (Idle, vec![0, 1]),
            // vm0: 30 + 15 - 30 (clamp) ... 30 - 40 = -10 <= 0: demoted, vm1 runs.
            (Dispatch(sub(1, 0, 1)), vec![1, 0]),
            // vm1: 30 - 10 = 20 > 0: keeps the head while vm0 waits.
            (Dispatch(sub(1, 0, 2)), vec![1, 0]),
            // vm1: 30 - 40 = -10: demoted; vm0 gets the GPU.
            (Dispatch(sub(0, 0, 2)), vec![0, 1]),
        ]
    );
}

#[test]
fn band_demotes_only_when_over_budget_and_over_share() {
    let got = demotion_script(Policy::Band);
    assert_eq!(
        got[..3],
        [
            (Dispatch(sub(0, 0, 1)), vec![0, 1]),
            (Idle, vec![0, 1]),
            // vm0's credit is -10 ms but its measured utilisation (0 at the 30 ms tick) is not
            // above its share: it keeps the head and its queued work runs.
            (Dispatch(sub(0, 0, 2)), vec![0, 1]),
        ]
    );
    // Credit < 0 and utilisation > share: demoted.
    let mut b = two(Policy::Band, SchedParams::default());
    b.submit(sub(0, 0, 1), 0);
    assert_eq!(b.decide(&[], 4, 0), Dispatch(sub(0, 0, 1)));
    b.submit(sub(1, 0, 1), MS);
    b.submit(sub(0, 0, 2), MS);
    b.complete(&sub(0, 0, 1), 20 * MS, 20 * MS);
    // credit 30 - 20 = 10, utilisation 0: stays.
    assert_eq!(b.decide(&[], 4, 20 * MS), Dispatch(sub(0, 0, 2)));
    b.submit(sub(0, 0, 3), 21 * MS);
    // Tick at 30 ms: utilisation 20/30 > 1/2, credit 10 + 15 -> 25.
    b.complete(&sub(0, 0, 2), 45 * MS, 25 * MS);
    assert_eq!(credit(&*b, 0), 0);
    assert_eq!(util(&*b, 0), 666_666);
    assert_eq!(
        b.decide(&[], 4, 45 * MS),
        Dispatch(sub(0, 0, 3)),
        "credit 0 is not < 0: stays at the head"
    );
    b.submit(sub(0, 0, 4), 46 * MS);
    b.complete(&sub(0, 0, 3), 50 * MS, MS);
    assert_eq!(
        order(&*b),
        vec![1, 0],
        "credit -1 ms and over its share: demoted"
    );
    assert_eq!(b.snapshot().demotions, 1);
    // vm1 is not over its share: no time buffer.
    assert_eq!(b.decide(&[], 4, 50 * MS), Dispatch(sub(1, 0, 1)));
}

// ---------------------------------------------------------------- time buffer

/// vm1 becomes over its share (20 ms alone before the 30 ms tick), then vm0 runs a short
/// kernel while vm1 has one queued; vm0 has nothing queued when its kernel completes.
fn buffer_setup(policy: Policy, p: SchedParams) -> Box<dyn Scheduler> {
    let mut s = two(policy, p);
    s.submit(sub(1, 0, 1), 0);
    assert_eq!(s.decide(&[], 4, 0), Dispatch(sub(1, 0, 1)));
    s.complete(&sub(1, 0, 1), 20 * MS, 20 * MS);
    assert_eq!(s.decide(&[], 4, 20 * MS), Idle);
    s.submit(sub(0, 0, 1), 31 * MS);
    assert_eq!(s.decide(&[], 4, 31 * MS), Dispatch(sub(0, 0, 1)));
    s.submit(sub(1, 0, 2), 31 * MS);
    assert_eq!(s.decide(&[sub(0, 0, 1)], 4, 31 * MS), Idle);
    s.complete(&sub(0, 0, 1), 32 * MS, MS);
    s
}

#[test]
fn band_time_buffer_lets_a_short_running_vm_in_first() {
    let mut b = buffer_setup(Policy::Band, SchedParams::default());
    assert!(util(&*b, 1) > 500_000);
    let until = 32 * MS + 500 * US;
    assert_eq!(b.decide(&[], 4, 32 * MS), WaitUntil(until));
    assert_eq!(b.decide(&[], 4, 32 * MS + 200 * US), WaitUntil(until));
    // vm0 re-submits within the buffer and takes the GPU.
    b.submit(sub(0, 0, 2), 32 * MS + 200 * US);
    assert_eq!(b.decide(&[], 4, 32 * MS + 200 * US), Dispatch(sub(0, 0, 2)));
    let snap = b.snapshot();
    assert_eq!((snap.waits, snap.waits_taken), (1, 1));
}

#[test]
fn band_time_buffer_has_one_chance_then_the_selected_vm_runs() {
    let mut b = buffer_setup(Policy::Band, SchedParams::default());
    let until = 32 * MS + 500 * US;
    assert_eq!(b.decide(&[], 4, 32 * MS), WaitUntil(until));
    assert_eq!(b.decide(&[], 4, until - 1), WaitUntil(until));
    assert_eq!(b.decide(&[], 4, until), Dispatch(sub(1, 0, 2)));
    assert_eq!(b.snapshot().waits_taken, 0);

    // Two chances: a second buffer after the first.
    let p = SchedParams {
        wait_chances: 2,
        ..SchedParams::default()
    };
    let mut b = buffer_setup(Policy::Band, p);
    assert_eq!(b.decide(&[], 4, 32 * MS), WaitUntil(until));
    assert_eq!(b.decide(&[], 4, until), WaitUntil(until + 500 * US));
    assert_eq!(b.decide(&[], 4, until + 500 * US), Dispatch(sub(1, 0, 2)));
    assert_eq!(b.snapshot().waits, 2);

    // No buffer at all when it is disabled, or for CREDIT.
    let p = SchedParams {
        wait_ns: 0,
        ..SchedParams::default()
    };
    let mut b = buffer_setup(Policy::Band, p);
    assert_eq!(b.decide(&[], 4, 32 * MS), Dispatch(sub(1, 0, 2)));
    let mut c = buffer_setup(Policy::Credit, SchedParams::default());
    assert_eq!(c.decide(&[], 4, 32 * MS), Dispatch(sub(1, 0, 2)));
    assert_eq!(c.snapshot().waits, 0);
}

#[test]
fn band_time_buffer_only_before_another_vm_over_its_share() {
    // The next VM is under its share: no wait.
    let mut b = two(Policy::Band, SchedParams::default());
    b.submit(sub(0, 0, 1), 0);
    assert_eq!(b.decide(&[], 4, 0), Dispatch(sub(0, 0, 1)));
    b.submit(sub(1, 0, 1), 0);
    b.complete(&sub(0, 0, 1), MS, MS);
    assert_eq!(b.decide(&[], 4, MS), Dispatch(sub(1, 0, 1)));
    // The next VM is the one that completed (over its share): it simply continues.
    b.submit(sub(1, 0, 2), 2 * MS);
    b.complete(&sub(1, 0, 1), 29 * MS, 28 * MS);
    assert_eq!(b.decide(&[], 4, 29 * MS), Dispatch(sub(1, 0, 2)));
    b.submit(sub(1, 0, 3), 31 * MS);
    b.complete(&sub(1, 0, 2), 35 * MS, 6 * MS);
    assert!(util(&*b, 1) > 500_000);
    assert_eq!(b.decide(&[], 4, 35 * MS), Dispatch(sub(1, 0, 3)));
    assert_eq!(b.snapshot().waits, 0);
}

#[test]
fn band_buffer_while_the_previous_vm_drains() {
    // vm0 has two submissions in flight; the first completes with nothing queued and vm1
    // (over its share) waiting: the buffer runs while vm0's second submission still runs.
    let mut b = two(Policy::Band, SchedParams::default());
    b.submit(sub(1, 0, 1), 0);
    assert_eq!(b.decide(&[], 4, 0), Dispatch(sub(1, 0, 1)));
    b.complete(&sub(1, 0, 1), 20 * MS, 20 * MS);
    b.submit(sub(0, 0, 1), 31 * MS);
    b.submit(sub(0, 1, 1), 31 * MS);
    assert_eq!(b.decide(&[], 4, 31 * MS), Dispatch(sub(0, 0, 1)));
    assert_eq!(
        b.decide(&[sub(0, 0, 1)], 4, 31 * MS),
        Dispatch(sub(0, 1, 1))
    );
    b.submit(sub(1, 0, 2), 31 * MS);
    b.complete(&sub(0, 0, 1), 32 * MS, MS);
    let until = 32 * MS + 500 * US;
    assert_eq!(b.decide(&[sub(0, 1, 1)], 4, 32 * MS), WaitUntil(until));
    // The other completion during the buffer does not restart it.
    b.complete(&sub(0, 1, 1), 32 * MS + 100 * US, 100 * US);
    assert_eq!(b.decide(&[], 4, 32 * MS + 100 * US), WaitUntil(until));
    assert_eq!(b.decide(&[], 4, until), Dispatch(sub(1, 0, 2)));
}

/// Gdev's rules with the experiment's defaults otherwise (`Policy::BandGdev`).
fn gdev_params() -> SchedParams {
    SchedParams {
        adaptive_wait: false,
        util_of_busy: false,
        ..SchedParams::default()
    }
}

#[test]
fn band_adaptive_buffer_is_not_ended_by_the_vm_it_holds_and_grows_with_the_reaction() {
    // Gdev: vm1 (over its share) re-submits during the buffer held against it and takes it.
    let mut g = buffer_setup(Policy::Band, gdev_params());
    assert_eq!(g.decide(&[], 4, 32 * MS), WaitUntil(32 * MS + 500 * US));
    g.submit(sub(1, 0, 3), 32 * MS + 200 * US);
    assert_eq!(g.decide(&[], 4, 32 * MS + 200 * US), Dispatch(sub(1, 0, 3)));

    // Adaptive (default): vm1's arrival is held with its queued work; vm0, 400 us after its
    // completion, takes the buffer.
    let mut b = buffer_setup(Policy::Band, SchedParams::default());
    assert_eq!(b.decide(&[], 4, 32 * MS), WaitUntil(32 * MS + 500 * US));
    b.submit(sub(1, 0, 3), 32 * MS + 200 * US);
    assert_eq!(
        b.decide(&[], 4, 32 * MS + 200 * US),
        WaitUntil(32 * MS + 500 * US)
    );
    b.submit(sub(0, 0, 2), 32 * MS + 400 * US);
    assert_eq!(b.decide(&[], 4, 32 * MS + 400 * US), Dispatch(sub(0, 0, 2)));
    assert_eq!((b.snapshot().waits, b.snapshot().waits_taken), (1, 1));
    // vm0 reacted in 400 us: its next buffer is 400 x 150 % = 600 us.
    b.complete(&sub(0, 0, 2), 33 * MS, 600 * US);
    assert_eq!(b.decide(&[], 4, 33 * MS), WaitUntil(33 * MS + 600 * US));
    // Nobody comes: vm1 runs when it ends.
    assert_eq!(b.decide(&[], 4, 33 * MS + 600 * US), Dispatch(sub(1, 0, 3)));
}

#[test]
fn band_adaptive_buffer_is_held_when_nobody_has_work() {
    // vm1 ran alone (over its share) and has nothing queued when vm0's kernel completes;
    // vm1 re-submits 100 us later, vm0 200 us later.
    let script = |p: SchedParams| {
        let mut b = two(Policy::Band, p);
        b.submit(sub(1, 0, 1), 0);
        assert_eq!(b.decide(&[], 4, 0), Dispatch(sub(1, 0, 1)));
        b.complete(&sub(1, 0, 1), 20 * MS, 20 * MS);
        b.submit(sub(0, 0, 1), 31 * MS);
        assert_eq!(b.decide(&[], 4, 31 * MS), Dispatch(sub(0, 0, 1)));
        b.complete(&sub(0, 0, 1), 32 * MS, MS);
        assert_eq!(b.decide(&[], 4, 32 * MS), Idle);
        b.submit(sub(1, 0, 2), 32 * MS + 100 * US);
        let first = b.decide(&[], 4, 32 * MS + 100 * US);
        b.submit(sub(0, 0, 2), 32 * MS + 200 * US);
        let inflight: Vec<Submission> = match first {
            Dispatch(s) => vec![s],
            _ => vec![],
        };
        let second = b.decide(&inflight, 4, 32 * MS + 200 * US);
        (first, second)
    };
    // Gdev: the GPU is free, vm1 arrives first and takes it; vm0 waits for its kernel.
    assert_eq!(script(gdev_params()), (Dispatch(sub(1, 0, 2)), Idle));
    // Adaptive: the GPU is kept for vm0 (under its share) for its wait; vm1 is held.
    assert_eq!(
        script(SchedParams::default()),
        (WaitUntil(32 * MS + 500 * US), Dispatch(sub(0, 0, 2)))
    );
}

/// Two BAND VMs where vm1 ran 20 ms alone (over its share) and vm0 then reacted once in 2 ms
/// (it is waited for 3 ms from now on); vm0 runs its second kernel (done at 36 ms) and vm1
/// has queued its third.
fn band_with_vm0_reacting_in_2ms() -> BandScheduler {
    let mut b = BandScheduler::new(SchedParams::default());
    b.add_vm(VmId(0), 1, 0);
    b.add_vm(VmId(1), 1, 0);
    b.submit(sub(1, 0, 1), 0);
    assert_eq!(b.decide(&[], 4, 0), Dispatch(sub(1, 0, 1)));
    b.complete(&sub(1, 0, 1), 20 * MS, 20 * MS);
    b.submit(sub(0, 0, 1), 31 * MS);
    assert_eq!(b.decide(&[], 4, 31 * MS), Dispatch(sub(0, 0, 1)));
    b.submit(sub(1, 0, 2), 31 * MS);
    // Completion at 32 ms, back at 34 ms (the first buffer is 500 µs and expires: vm1 runs).
    b.complete(&sub(0, 0, 1), 32 * MS, MS);
    assert_eq!(b.decide(&[], 4, 32 * MS), WaitUntil(32 * MS + 500 * US));
    assert_eq!(b.decide(&[], 4, 32 * MS + 500 * US), Dispatch(sub(1, 0, 2)));
    b.submit(sub(0, 0, 2), 34 * MS);
    b.complete(&sub(1, 0, 2), 35 * MS, 2 * MS + 500 * US);
    assert_eq!(b.decide(&[], 4, 35 * MS), Dispatch(sub(0, 0, 2)));
    b.submit(sub(1, 0, 3), 35 * MS);
    b
}

/// A time buffer held for a VM whose work a capping policy holds back ends at once, and none
/// is started for it while it stays throttled; the VM held by the buffer is shown as such.
#[test]
fn band_holds_no_buffer_for_a_throttled_vm() {
    let setup = band_with_vm0_reacting_in_2ms;
    // Unthrottled: the GPU is kept for vm0 and vm1 is held by the buffer.
    let mut b = setup();
    b.complete(&sub(0, 0, 2), 36 * MS, MS);
    assert_eq!(b.decide(&[], 4, 36 * MS), WaitUntil(39 * MS));
    let snap = b.snapshot();
    assert!(snap.vms[1].held_by_buffer && !snap.vms[0].held_by_buffer);
    // vm0's cap runs out while the buffer is held for it: the buffer ends, vm1 runs now.
    b.set_throttled(VmId(0), true);
    assert!(!b.snapshot().vms[1].held_by_buffer);
    assert_eq!(b.snapshot().buffers_cancelled, 1);
    assert_eq!(b.decide(&[], 4, 36 * MS), Dispatch(sub(1, 0, 3)));
    // Throttled before its completion: no buffer at all.
    let mut b = setup();
    b.set_throttled(VmId(0), true);
    b.complete(&sub(0, 0, 2), 36 * MS, MS);
    assert_eq!(b.decide(&[], 4, 36 * MS), Dispatch(sub(1, 0, 3)));
    assert_eq!(b.snapshot().buffers_cancelled, 0);
}

#[test]
fn band_does_not_wait_for_a_vm_that_stayed_away_until_it_comes_back() {
    // vm0 reacts in 2 ms (waited for: 3 ms), then once in 12 ms (> wait_max 10 ms): after
    // that gap it gets Gdev's 500 µs buffer, which vm1's arrival takes; after a 2 ms gap
    // it is waited for again, as before the long one.
    let mut b = band_with_vm0_reacting_in_2ms();
    b.complete(&sub(0, 0, 2), 36 * MS, MS);
    assert_eq!(
        b.decide(&[], 4, 36 * MS),
        WaitUntil(39 * MS),
        "2 ms x 150 %"
    );
    // vm0 stays away 12 ms: vm1 runs at 39 ms.
    assert_eq!(b.decide(&[], 4, 39 * MS), Dispatch(sub(1, 0, 3)));
    b.submit(sub(0, 0, 3), 48 * MS);
    b.complete(&sub(1, 0, 3), 49 * MS, 10 * MS);
    assert_eq!(b.decide(&[], 4, 49 * MS), Dispatch(sub(0, 0, 3)));
    b.submit(sub(1, 0, 4), 49 * MS);
    b.complete(&sub(0, 0, 3), 50 * MS, MS);
    assert_eq!(b.decide(&[], 4, 50 * MS), WaitUntil(50 * MS + 500 * US));
    b.submit(sub(1, 0, 5), 50 * MS + 100 * US);
    assert_eq!(
        b.decide(&[], 4, 50 * MS + 100 * US),
        Dispatch(sub(1, 0, 5)),
        "Gdev's buffer: vm1's arrival takes it"
    );
    // Back within 2 ms: waited for again, 3 ms (the 12 ms gap did not enter the estimate).
    b.submit(sub(0, 0, 4), 52 * MS);
    b.complete(&sub(1, 0, 5), 60 * MS, 9_900 * US);
    assert_eq!(b.decide(&[], 4, 60 * MS), Dispatch(sub(0, 0, 4)));
    b.submit(sub(1, 0, 6), 60 * MS);
    b.complete(&sub(0, 0, 4), 61 * MS, MS);
    assert_eq!(b.decide(&[], 4, 61 * MS), WaitUntil(64 * MS));
    b.submit(sub(1, 0, 7), 61 * MS + 100 * US);
    assert_eq!(b.decide(&[], 4, 61 * MS + 100 * US), WaitUntil(64 * MS));
}

#[test]
fn band_does_not_wait_adaptively_for_a_vm_much_slower_than_its_kernels() {
    // vm0's kernels take 50 us of GPU time and it reacts in 400 us (8x > wait_max_ratio 5):
    // Gdev's buffer, which vm1's arrival takes.
    let mut b = two(Policy::Band, SchedParams::default());
    b.submit(sub(1, 0, 1), 0);
    assert_eq!(b.decide(&[], 4, 0), Dispatch(sub(1, 0, 1)));
    b.complete(&sub(1, 0, 1), 20 * MS, 20 * MS);
    b.submit(sub(0, 0, 1), 31 * MS);
    assert_eq!(b.decide(&[], 4, 31 * MS), Dispatch(sub(0, 0, 1)));
    b.submit(sub(1, 0, 2), 31 * MS);
    b.complete(&sub(0, 0, 1), 31 * MS + 50 * US, 50 * US);
    let t = 31 * MS + 50 * US;
    assert_eq!(b.decide(&[], 4, t), WaitUntil(t + 500 * US));
    b.submit(sub(0, 0, 2), t + 400 * US);
    assert_eq!(b.decide(&[], 4, t + 400 * US), Dispatch(sub(0, 0, 2)));
    b.complete(&sub(0, 0, 2), t + 450 * US, 50 * US);
    let t = t + 450 * US;
    assert_eq!(b.decide(&[], 4, t), WaitUntil(t + 500 * US));
    b.submit(sub(1, 0, 3), t + 100 * US);
    assert_eq!(b.decide(&[], 4, t + 100 * US), Dispatch(sub(1, 0, 3)));
}

#[test]
fn band_arrival_yield_is_optional() {
    let script = |p: SchedParams| {
        let mut b = two(Policy::Band, p);
        b.submit(sub(1, 0, 1), 0);
        assert_eq!(b.decide(&[], 4, 0), Dispatch(sub(1, 0, 1)));
        b.complete(&sub(1, 0, 1), 100 * MS, 100 * MS);
        b.submit(sub(1, 0, 2), 121 * MS);
        // Tick at 120 ms: utilisation 100/120, credit -30 ms.
        assert_eq!(b.decide(&[], 4, 121 * MS), Dispatch(sub(1, 0, 2)));
        b.submit(sub(1, 1, 1), 122 * MS);
        let first = b.decide(&[sub(1, 0, 2)], 4, 122 * MS);
        b.submit(sub(0, 0, 1), 122 * MS + 200 * US);
        let second = b.decide(&[sub(1, 0, 2)], 4, 122 * MS + 200 * US);
        (first, second, b)
    };
    let (first, second, _) = script(SchedParams::default());
    assert_eq!(first, Dispatch(sub(1, 1, 1)), "vm1 tops up");
    assert_eq!(second, Idle, "vm0 waits for vm1's turn to end");

    let (first, second, mut b) = script(SchedParams {
        arrival_yield: true,
        ..SchedParams::default()
    });
    assert_eq!(first, WaitUntil(122 * MS + 500 * US), "vm1 yields");
    assert_eq!(second, Idle, "vm0 took the GPU; vm1's work drains first");
    b.complete(&sub(1, 0, 2), 123 * MS, MS);
    assert_eq!(order(&*b), vec![0, 1]);
    assert_eq!(b.decide(&[], 4, 123 * MS), Dispatch(sub(0, 0, 1)));
}

#[test]
fn removal_keeps_the_gpu_busy_with_what_is_left() {
    for policy in [Policy::Credit, Policy::Band] {
        let mut s = two(policy, SchedParams::default());
        s.submit(sub(0, 0, 1), 0);
        s.submit(sub(1, 0, 1), 0);
        s.submit(sub(1, 1, 1), 0);
        assert_eq!(s.queued(), 3);
        assert_eq!(s.remove_channel(VmId(0), 0), 1);
        assert_eq!(s.decide(&[], 4, 0), Dispatch(sub(1, 0, 1)));
        assert_eq!(s.remove_vm(VmId(1)), 1);
        assert_eq!(s.queued(), 0);
        assert_eq!(s.decide(&[], 4, 0), Idle);
        s.submit(sub(0, 0, 2), MS);
        assert_eq!(s.decide(&[], 4, MS), Dispatch(sub(0, 0, 2)));
        assert_eq!(credit(&*s, 0), 30 * MS as i64);
    }
}

// ---------------------------------------------------------------- mock GPU

fn short_long(policy: Policy, secs: u64) -> MockGpu {
    let mut m = MockGpu::new(policy.create(&SchedParams::default()), 4);
    m.add_vm(0, 1);
    m.add_vm(1, 1);
    // vm0 re-submits when its kernel completed (nothing queued at that moment); vm1 keeps
    // two long kernels outstanding.
    let mut guests = [
        Guest::new(0, 1, 1, vec![500 * US], 0),
        Guest::new(1, 1, 2, vec![10 * MS], secs * 1000 * MS / 6),
    ];
    m.run(&mut guests, secs * 1000 * MS);
    m
}

#[test]
fn short_versus_long_on_the_mock_gpu() {
    // (See also `slow_guests_on_the_mock_gpu`.)
    // The GPUvm/Gdev setup on the mock GPU: only BAND holds the 50/50 split.
    let share = |m: &MockGpu| m.busy(0) as f64 / (m.busy(0) + m.busy(1)) as f64;
    let fifo = short_long(Policy::Fifo, 3);
    let credit = short_long(Policy::Credit, 3);
    let band = short_long(Policy::Band, 3);
    for m in [&fifo, &credit, &band] {
        assert_eq!(m.idle_with_work, 0);
        assert_eq!(m.acct.total_busy_ns(m.now), m.gpu_busy);
    }
    assert_eq!(fifo.wait_idle + credit.wait_idle, 0);
    let (f, c, b) = (share(&fifo), share(&credit), share(&band));
    // (Shares over the whole run, including the half second vm0 runs alone.)
    assert!(f < 0.25, "fifo: short VM share {f}");
    assert!(c < 0.25, "credit: short VM share {c}");
    assert!(b > 0.45, "band: short VM share {b}");
    assert!(band.log.iter().any(|e| matches!(e, Ev::Wait { .. })));
}

/// The GPUvm/Gdev setup with guests that take 500 µs to react after each completion (both
/// VMs): Gdev's fixed 500 µs buffer is lost to the long-kernel VM's own re-submission and the
/// short VM gets ~12 % of the GPU; the adaptive buffer keeps it near 50 %, paying with idle
/// time (about its reaction per short kernel while the long VM is held).
#[test]
fn slow_guests_on_the_mock_gpu() {
    let run = |p: SchedParams| {
        let mut m = MockGpu::new(Policy::Band.create(&p), 4);
        m.add_vm(0, 1);
        m.add_vm(1, 1);
        let mut guests = [
            Guest::new(0, 1, 1, vec![500 * US], 0),
            Guest::new(1, 1, 2, vec![10 * MS], 0),
        ];
        for g in &mut guests {
            g.think = 500 * US;
        }
        m.run(&mut guests, 5_000 * MS);
        m
    };
    let share = |m: &MockGpu| m.busy(0) as f64 / (m.busy(0) + m.busy(1)) as f64;
    let (gdev, adaptive) = (run(gdev_params()), run(SchedParams::default()));
    for m in [&gdev, &adaptive] {
        assert_eq!(m.idle_with_work, 0);
        assert_eq!(m.acct.total_busy_ns(m.now), m.gpu_busy);
    }
    let (g, a) = (share(&gdev), share(&adaptive));
    assert!((g - 0.5).abs() > 0.3, "gdev: short VM share {g}");
    assert!((a - 0.5).abs() < 0.05, "adaptive: short VM share {a}");
    // The price: the GPU idles while the long VM is held for the short VM's reaction
    // (at most one reaction, 500 µs, per short kernel of 500 µs).
    assert!(adaptive.wait_idle > 0);
    assert!(
        adaptive.wait_idle <= adaptive.busy(0),
        "{}",
        adaptive.wait_idle
    );
}

/// The case the property test below found: under Gdev's exact BAND, vm1 (over its share by a
/// hair, credit positive) sits ahead of vm0 in the run list; vm2 (under its share, re-submitting
/// 150 µs after each completion) takes every time buffer held for vm1, vm1 never runs and so is
/// never demoted, and vm0 behind it waits for seconds. With `requeue_on_lost_wait` (default)
/// the VM whose buffer was taken goes to the tail and vm0 gets its turn.
#[test]
fn band_lost_buffers_cannot_block_the_run_list() {
    let gdev = SchedParams {
        adaptive_wait: false,
        util_of_busy: false,
        ..SchedParams::default()
    };
    let run = |requeue: bool, p: &SchedParams| {
        let p = SchedParams {
            requeue_on_lost_wait: requeue,
            ..p.clone()
        };
        let mut m = MockGpu::new(Policy::Band.create(&p), 1);
        let mut guests = Vec::new();
        for (vm, (w, ch, depth, ns, start, think)) in [
            (2, 1, 1, 832_590, 97_696_888, 137_052),
            (3, 3, 1, 366_689, 37_193_203, 0),
            (4, 1, 2, 68_187, 345_111_545, 150_260),
        ]
        .into_iter()
        .enumerate()
        {
            m.add_vm(vm as u32, w);
            let mut g = Guest::new(vm as u32, ch, depth, vec![ns], start);
            g.think = think;
            guests.push(g);
        }
        m.run(&mut guests, 4_000 * MS);
        m.max_queue_delay[&0]
    };
    assert!(
        run(false, &gdev) > 3_000 * MS,
        "Gdev's exact rule starves vm0"
    );
    // What is left is vm0 waiting while it is itself over its share (its utilisation decays
    // within a window).
    assert!(
        run(true, &gdev) < 1_000 * MS,
        "{} ms",
        run(true, &gdev) / MS
    );
    let default = SchedParams::default();
    assert!(
        run(true, &default) < 1_000 * MS,
        "{} ms",
        run(true, &default) / MS
    );
}

#[derive(Debug, Clone)]
struct GuestSpec {
    channels: u32,
    depth: u32,
    kernels: Vec<u64>,
    start: u64,
    think: u64,
    weight: u32,
}

fn guest_spec() -> impl Strategy<Value = GuestSpec> {
    (
        1u32..=3,
        1u32..=3,
        prop::collection::vec(
            prop_oneof![10 * US..500 * US, 500 * US..5 * MS, 5 * MS..25 * MS],
            1..4,
        ),
        0u64..400 * MS,
        prop_oneof![Just(0u64), 0u64..2 * MS],
        1u32..=4,
    )
        .prop_map(
            |(channels, depth, kernels, start, think, weight)| GuestSpec {
                channels,
                depth,
                kernels,
                start,
                think,
                weight,
            },
        )
}

fn run_specs(policy: Policy, specs: &[GuestSpec], end: u64, max_inflight: usize) -> MockGpu {
    let mut m = MockGpu::new(policy.create(&SchedParams::default()), max_inflight);
    let mut guests = Vec::new();
    for (i, g) in specs.iter().enumerate() {
        m.add_vm(i as u32, g.weight);
        let mut guest = Guest::new(i as u32, g.channels, g.depth, g.kernels.clone(), g.start);
        guest.think = g.think;
        guests.push(guest);
    }
    m.run(&mut guests, end);
    m
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Credit and band: every VM with queued work gets the GPU within a bound (a few utilisation
    /// windows); the GPU is never idle with work queued except during BAND's wait; the time
    /// accounted to the VMs is the GPU's busy time.
    #[test]
    fn fair_policies_are_starvation_free_and_work_conserving(
        specs in prop::collection::vec(guest_spec(), 2..6),
        max_inflight in 1usize..=4,
    ) {
        for policy in [Policy::Credit, Policy::Band] {
            let m = run_specs(policy, &specs, 4_000 * MS, max_inflight);
            prop_assert_eq!(m.idle_with_work, 0, "{} idle with work queued", policy);
            if policy == Policy::Credit {
                prop_assert_eq!(m.wait_idle, 0);
            }
            prop_assert_eq!(m.acct.total_busy_ns(m.now), m.gpu_busy);
            let per_vm: u64 = (0..specs.len() as u32).map(|v| m.busy(v)).sum();
            prop_assert_eq!(per_vm, m.gpu_busy);
            for (vm, d) in &m.max_queue_delay {
                prop_assert!(*d <= 2_500 * MS, "{}: vm{} waited {} ms", policy, vm, d / MS);
            }
            prop_assert_eq!(m.max_queue_delay.len(), specs.len(), "every VM ran");
        }
    }

    /// FIFO is FIFO: submissions are dispatched in the order they were created, and the GPU is
    /// never idle with work queued. (It is not fair: see `short_versus_long_on_the_mock_gpu`.)
    #[test]
    fn fifo_dispatches_in_arrival_order(
        specs in prop::collection::vec(guest_spec(), 2..6),
        max_inflight in 1usize..=4,
    ) {
        let m = run_specs(Policy::Fifo, &specs, 1_000 * MS, max_inflight);
        prop_assert_eq!(m.idle_with_work + m.wait_idle, 0);
        let order: Vec<(u32, u32)> = m.dispatches.iter().map(|d| (d.0, d.1)).collect();
        prop_assert_eq!(order, m.arrivals.clone());
        prop_assert_eq!(m.acct.total_busy_ns(m.now), m.gpu_busy);
    }
}

/// A capped VM gets no more than its cap, with a competitor and alone on an otherwise idle GPU;
/// an uncapped competitor takes the rest, and nothing is lost.
#[test]
fn fixed_share_caps_hold_with_and_without_competition() {
    let cases = [(true, MS), (false, MS), (true, 10 * MS), (false, 250 * US)];
    // A cap is a ceiling under every policy, not only fixed-share.
    let policies = [
        Policy::FixedShare,
        Policy::Band,
        Policy::Credit,
        Policy::Fifo,
    ];
    for (policy, (competitor, kernel)) in policies
        .into_iter()
        .flat_map(|p| cases.into_iter().map(move |c| (p, c)))
    {
        let mut gpu = MockGpu::new(policy.create(&SchedParams::default()), 4);
        gpu.add_vm(0, 1);
        gpu.add_vm(1, 1);
        gpu.sched.set_cap(VmId(0), Some(300_000), 0).unwrap();
        gpu.sched.set_cap(VmId(1), Some(1_000_000), 0).unwrap();
        assert_eq!(gpu.sched.cap_ppm(VmId(0)), Some(300_000));
        let mut guests = vec![Guest::new(0, 2, 2, vec![kernel], 0)];
        if competitor {
            guests.push(Guest::new(1, 1, 2, vec![2 * MS], 0));
        }
        let end = 3_000 * MS;
        gpu.run(&mut guests, end);
        let (b0, b1) = (gpu.busy(0), gpu.busy(1));
        // Cap x elapsed, plus one period's burst, plus what max_inflight submissions can
        // overdraw before the bucket is seen empty.
        // (`run` drains the queues after `end`: the cap holds over the whole run.)
        let bound = gpu.now * 3 / 10 + 30 * MS * 3 / 10 + 4 * kernel;
        assert!(
            b0 <= bound,
            "{policy}: capped vm0 ran {b0} ns > {bound} ({competitor}, {kernel})"
        );
        assert!(
            b0 >= end * 3 / 10 - 30 * MS,
            "vm0 got far less than its cap: {b0}"
        );
        if competitor {
            assert!(b1 >= end * 6 / 10, "the uncapped VM takes the rest: {b1}");
        } else {
            assert_eq!(b1, 0);
            assert!(
                gpu.wait_idle > end / 2,
                "the GPU idles rather than exceed the cap"
            );
        }
        assert_eq!(
            gpu.idle_with_work, 0,
            "idle with work outside a deliberate wait"
        );
        assert_eq!(b0 + b1, gpu.gpu_busy, "accounting matches the GPU");
    }
}

/// Caps are checked; fixed-share caps every VM, and every policy takes a cap set for a VM (a
/// cap is a ceiling whatever the policy).
#[test]
fn caps_are_validated_and_every_policy_takes_them() {
    let mut s = two(Policy::FixedShare, SchedParams::default());
    assert!(s.set_cap(VmId(0), Some(0), 0).is_err());
    assert!(s.set_cap(VmId(0), Some(1_000_001), 0).is_err());
    assert!(s.set_cap(VmId(7), Some(10), 0).is_err());
    // Without an explicit cap a VM is capped at its weight's share.
    assert_eq!(s.cap_ppm(VmId(0)), Some(500_000));
    assert!(s.set_weight(VmId(0), 3, 0));
    assert_eq!(s.cap_ppm(VmId(0)), Some(750_000));
    s.set_cap(VmId(0), Some(100_000), 0).unwrap();
    assert_eq!(s.cap_ppm(VmId(0)), Some(100_000));
    s.set_cap(VmId(0), None, 0).unwrap();
    assert_eq!(s.cap_ppm(VmId(0)), Some(750_000));
    for p in [
        Policy::Fifo,
        Policy::Credit,
        Policy::Band,
        Policy::EqualShare,
    ] {
        let mut s = two(p, SchedParams::default());
        assert_eq!(s.cap_ppm(VmId(0)), None, "{p}: no cap unless one is set");
        assert!(s.set_cap(VmId(0), Some(0), 0).is_err(), "{p}");
        s.set_cap(VmId(0), Some(100_000), 0).unwrap();
        assert_eq!(s.cap_ppm(VmId(0)), Some(100_000), "{p}");
        assert_eq!(s.cap_ppm(VmId(1)), None, "{p}");
        s.set_cap(VmId(0), None, 0).unwrap();
        assert_eq!(s.cap_ppm(VmId(0)), None, "{p}");
    }
    assert!(!two(Policy::Fifo, SchedParams::default()).set_weight(VmId(0), 2, 0));
    assert!(!two(Policy::EqualShare, SchedParams::default()).set_weight(VmId(0), 2, 0));
    assert!(!two(Policy::Band, SchedParams::default()).set_weight(VmId(9), 2, 0));
}

/// Equal share ignores weights; BAND follows them, also when they change at run time.
#[test]
fn equal_share_ignores_weights_and_band_follows_a_runtime_weight_change() {
    let share = |policy: Policy, change: bool| {
        let mut gpu = MockGpu::new(policy.create(&SchedParams::default()), 4);
        gpu.add_vm(0, 3);
        gpu.add_vm(1, 1);
        let mut guests = vec![
            Guest::new(0, 1, 2, vec![MS], 0),
            Guest::new(1, 1, 2, vec![MS], 0),
        ];
        gpu.run(&mut guests, 2_000 * MS);
        let first = gpu.busy(0) as f64 / (gpu.busy(0) + gpu.busy(1)) as f64;
        if change {
            assert!(gpu.sched.set_weight(VmId(0), 1, gpu.now));
            gpu.acct.set_weight(VmId(0), 1);
        }
        let (a0, a1) = (gpu.busy(0), gpu.busy(1));
        gpu.run(&mut guests, 6_000 * MS);
        let (d0, d1) = (gpu.busy(0) - a0, gpu.busy(1) - a1);
        (first, d0 as f64 / (d0 + d1) as f64)
    };
    let (eq, _) = share(Policy::EqualShare, false);
    assert!((eq - 0.5).abs() < 0.05, "equal share: vm0 {eq}");
    let (band, after) = share(Policy::Band, true);
    assert!((band - 0.75).abs() < 0.05, "BAND 3:1: vm0 {band}");
    assert!((after - 0.5).abs() < 0.05, "BAND after 1:1: vm0 {after}");
}
