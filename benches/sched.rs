//! Cost of one scheduling decision per submission, per policy, with 2, 8 and 64 VMs: the pure
//! scheduler (`gpuvm::sched`), no GPU and no device model.
//!
//! One iteration is the life of one submission as the host drives it: the submission on the
//! GPU completes (`complete`, which for CREDIT and BAND runs the demotion and selection), its
//! VM submits its next one (`submit`), and the host asks what to dispatch (`decide`) until the
//! policy says "idle" — i.e. the scheduler's whole share of a doorbell. Every VM is always
//! backlogged (one queued submission each), time advances by 100 µs of GPU time per iteration,
//! so CREDIT and BAND also cross a period tick every 300 iterations and exercise demotions.
//! VMs have weights 1 to 4.
//!
//! Run: `cargo bench --bench sched -- --warm-up-time 1 --measurement-time 2`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gpuvm::sched::{Decision, Policy, SchedParams, Scheduler, Submission, VmId};

const STEP_NS: u64 = 100_000;

fn sub(vm: u32, put: u32) -> Submission {
    Submission {
        vm: VmId(vm),
        guest_chid: 0,
        phys_chid: vm,
        put,
    }
}

/// A scheduler with `n` backlogged VMs and one submission on the GPU.
struct Rig {
    s: Box<dyn Scheduler>,
    now: u64,
    puts: Vec<u32>,
    running: Submission,
}

impl Rig {
    fn new(policy: Policy, n: u32) -> Rig {
        let mut s = policy.create(&SchedParams::default());
        for v in 0..n {
            s.add_vm(VmId(v), 1 + v % 4, 0);
        }
        let mut puts = vec![0; n as usize];
        for v in 0..n {
            puts[v as usize] += 1;
            s.submit(sub(v, puts[v as usize]), 0);
        }
        let Decision::Dispatch(running) = s.decide(&[], 1, 0) else {
            panic!("nothing dispatched");
        };
        Rig {
            s,
            now: 0,
            puts,
            running,
        }
    }

    /// One submission's life: completion, the VM's next doorbell, the decisions.
    fn step(&mut self) {
        self.now += STEP_NS;
        let done = self.running;
        self.s.complete(&done, self.now, STEP_NS);
        let v = done.vm.0 as usize;
        self.puts[v] += 1;
        self.s.submit(sub(done.vm.0, self.puts[v]), self.now);
        loop {
            match self.s.decide(&[], 1, self.now) {
                Decision::Dispatch(s) => {
                    self.running = s;
                    return;
                }
                // BAND's time buffer: the next event is its end.
                Decision::WaitUntil(t) => self.now = t,
                Decision::Idle => panic!("a backlogged scheduler went idle"),
            }
        }
    }
}

fn decisions(c: &mut Criterion) {
    let mut g = c.benchmark_group("decision_per_submission");
    for policy in Policy::ALL {
        for n in [2u32, 8, 64] {
            let mut rig = Rig::new(policy, n);
            g.bench_with_input(BenchmarkId::new(policy.name(), n), &n, |b, _| {
                b.iter(|| {
                    rig.step();
                    black_box(&rig.running);
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, decisions);
criterion_main!(benches);
