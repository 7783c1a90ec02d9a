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
    let mut r = Rig::with_executor(CostModel::quadro_6000(), 1 << 30, executor);
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
    put_words(&r, pa + words * 4, &b);
    let src = pa + 3 * words * 4;
    let pattern: Vec<u32> = (0..(1u32 << 18)).map(|i| i.rotate_left(7)).collect();
    put_words(&r, src, &pattern);
    let (va_a, va_b, va_c) = (DATA_VA, DATA_VA + words * 4, DATA_VA + 2 * words * 4);
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
        product: get_words(&r, pa + 2 * words * 4, words as usize),
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
