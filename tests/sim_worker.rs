//! The simulated GPU's engine worker (`gpuvm_sim::Executor::Worker`, the default with a real
//! clock): the same data and the same modeled time as the inline executor, with every piece of
//! engine work done by the worker and none by the calls.

use gpuvm::gf100::compute::Kernel;
use gpuvm::phys::PhysicalGpu;
use gpuvm_sim::*;

mod support;

use support::sim_rig::*;

/// What one run produced: the product, the copied bytes, modeled busy time, engine stats.
struct Outcome {
    product: Vec<u32>,
    copied: Vec<u32>,
    busy_ns: u64,
    work: EngineWorkStats,
}

fn run(executor: Executor) -> Outcome {
    run_with(
        Rig::with_executor(CostModel::quadro_6000(), 1 << 30, executor),
        false,
    )
}

/// One run on `r`. With `overlap`, `c` starts half a matrix after `a`: later rows of `a` are
/// overwritten by earlier rows of the product before they are read, so a block may not be
/// computed before the ones above it land.
fn run_with(mut r: Rig, overlap: bool) -> Outcome {
    let n = 300u64; // loads b in 6 pieces, each result row in 2 blocks
    let words = n * n;
    let mut c = r.channel(3);
    r.runlist(&[3]);
    let len = 3 * words * 4 + (2 << 20);
    let pa = r.buffer(&mut c, DATA_VA, len);
    let a: Vec<u32> = (0..words as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let b: Vec<u32> = (0..words as u32).map(|i| i ^ 0x5a5a).collect();
    put_words(&r, pa, &a);
    let (b_off, c_off) = if overlap {
        (2 * words * 4, words * 2)
    } else {
        (words * 4, 2 * words * 4)
    };
    put_words(&r, pa + b_off, &b);
    let src = pa + 3 * words * 4;
    let pattern: Vec<u32> = (0..(1u32 << 18)).map(|i| i.rotate_left(7)).collect();
    put_words(&r, src, &pattern);
    let (va_a, va_b, va_c) = (DATA_VA, DATA_VA + b_off, DATA_VA + c_off);
    let mut p = bind_compute();
    p.extend(launch_kernel(&Kernel::Mmul {
        a: va_a,
        b: va_b,
        c: va_c,
        n: n as u32,
    }));
    p.extend(bind_copy());
    p.extend(copy(
        DATA_VA + 3 * words * 4,
        DATA_VA + 3 * words * 4 + (1 << 20),
        0,
        0,
        1 << 20,
        1,
        0,
    ));
    r.submit(&mut c, &p);
    r.settle();
    assert!(r.runnable(&c), "the work stopped the channel");
    assert_eq!(r.gp_get(&c), c.put);
    Outcome {
        product: get_words(&r, pa + c_off, words as usize),
        copied: get_words(&r, src + (1 << 20), 1 << 18),
        busy_ns: r.gpu.stats().busy_ns,
        work: r.gpu.engine_work(),
    }
}

#[test]
fn the_worker_computes_what_the_caller_computes_in_the_same_modeled_time() {
    let inline = run(Executor::Inline);
    let worker = run(Executor::Worker);
    let n = 300usize;
    // A reference product, on the host.
    let a: Vec<u32> = (0..(n * n) as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let b: Vec<u32> = (0..(n * n) as u32).map(|i| i ^ 0x5a5a).collect();
    for (i, j) in [(0, 0), (17, 299), (299, 1), (150, 150)] {
        let want = (0..n).fold(0u32, |acc, k| {
            acc.wrapping_add(a[i * n + k].wrapping_mul(b[k * n + j]))
        });
        assert_eq!(inline.product[i * n + j], want, "inline c[{i}][{j}]");
    }
    assert_eq!(worker.product, inline.product);
    let pattern: Vec<u32> = (0..(1u32 << 18)).map(|i| i.rotate_left(7)).collect();
    assert_eq!(inline.copied, pattern);
    assert_eq!(worker.copied, pattern);
    assert_eq!(
        worker.busy_ns, inline.busy_ns,
        "modeled time is the executor's to keep"
    );
    assert!(inline.work.pieces > 12);
    assert_eq!(inline.work.worker_pieces, 0);
    assert_eq!(worker.work.pieces, inline.work.pieces);
    assert_eq!(
        worker.work.worker_pieces, worker.work.pieces,
        "no call performed a piece of engine work"
    );
}

#[test]
fn blocks_gathered_ahead_with_a_real_clock_leave_what_one_at_a_time_leaves() {
    let quadro = CostModel::quadro_6000;
    for overlap in [false, true] {
        let inline = run_with(
            Rig::with_executor(quadro(), 1 << 30, Executor::Inline),
            overlap,
        );
        let real = run_with(Rig::with_real_clock(quadro(), 1 << 30), overlap);
        assert_eq!(real.product, inline.product, "overlap {overlap}");
        assert_eq!(real.copied, inline.copied);
        assert_eq!(real.work.pieces, inline.work.pieces);
        // Apart, the worker ran ahead of the block it was at (a 300^3 product takes far
        // longer on a CPU than its modeled time, so its blocks are due); over `a`, never.
        assert_eq!(
            real.work.gathered_ahead > 0,
            !overlap,
            "overlap {overlap}: {:?}",
            real.work
        );
        assert_eq!(inline.work.gathered_ahead, 0);
    }
    // With a simulated clock the worker takes one block at a time (deterministic runs).
    let worker = run(Executor::Worker);
    assert_eq!(worker.work.gathered_ahead, 0);
    // With `c` over `a` the product is not a x b: later rows read what earlier ones wrote.
    let n = 300usize;
    let apart = run_with(
        Rig::with_executor(quadro(), 1 << 30, Executor::Inline),
        false,
    );
    let over = run_with(
        Rig::with_executor(quadro(), 1 << 30, Executor::Inline),
        true,
    );
    assert_eq!(over.product[..n * n / 2], apart.product[..n * n / 2]);
    assert_ne!(over.product[n * n / 2..], apart.product[n * n / 2..]);
}

#[test]
fn the_default_executor_follows_the_clock() {
    let sim = SimGpu::new(SimConfig::default());
    assert!(!sim.has_engine_worker());
    let real = SimGpu::new(SimConfig {
        clock: std::sync::Arc::new(gpuvm::clock::RealClock::new()),
        ..SimConfig::default()
    });
    assert!(real.has_engine_worker());
    // Dropping the GPU ends its worker (the test would hang otherwise).
    drop(real);
    assert_eq!(sim.vram_size(), 6 << 30);
}

/// The scheduling policies (`/proc/self/task/*/stat` field 41) of this process's engine
/// worker threads, or `None` where `/proc` does not tell.
fn engine_thread_policies() -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        // The kernel keeps 15 bytes of a thread's name.
        if !gpuvm_sim::ENGINE_THREAD_NAME.starts_with(comm.trim_end()) || comm.trim().is_empty() {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        // Fields after the parenthesised name start at field 3; the policy is field 41.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
        if let Some(p) = rest
            .split_whitespace()
            .nth(41 - 3)
            .and_then(|v| v.parse().ok())
        {
            out.push(p);
        }
    }
    Some(out)
}

/// Whether some engine worker thread runs under `policy` (`SimGpu::new` returns once its
/// worker runs under its policy).
fn some_engine_thread_under(policy: u32) -> Option<bool> {
    Some(engine_thread_policies()?.contains(&policy))
}

#[test]
fn the_engine_worker_asks_for_the_batch_policy_unless_told_otherwise() {
    const SCHED_OTHER: u32 = 0;
    const SCHED_BATCH: u32 = 3;
    let real = || std::sync::Arc::new(gpuvm::clock::RealClock::new());
    // Every other test of this binary keeps the default (batch), so a thread under the normal
    // policy can only be this one's.
    let normal = SimGpu::new(SimConfig {
        clock: real(),
        worker_policy: WorkerPolicy::Normal,
        ..SimConfig::default()
    });
    match some_engine_thread_under(SCHED_OTHER) {
        None => {
            eprintln!("SKIP: /proc/self/task is not readable here");
            return;
        }
        Some(found) => assert!(found, "a Normal worker keeps SCHED_OTHER"),
    }
    drop(normal);
    let batch = SimGpu::new(SimConfig {
        clock: real(),
        ..SimConfig::default()
    });
    assert!(batch.has_engine_worker());
    assert_eq!(
        some_engine_thread_under(SCHED_BATCH),
        Some(true),
        "the default worker runs under SCHED_BATCH (Linux lets any thread ask for it)"
    );
}
