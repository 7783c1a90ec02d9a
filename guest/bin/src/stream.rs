//! Guest modes that keep the GPU busy instead of running the Gdev workloads once:
//!
//! * [`stream`] (`MODE_STREAM`): the guest side of the performance-isolation experiment under
//!   KVM (GPUvm ATC'14 / Gdev ATC'12: a VM with short kernels against one with long kernels).
//!   After driver bring-up it creates a channel, waits at the VMM's start gate, optionally
//!   waits a start delay, then submits `loop` kernels of a fixed iteration count without
//!   blocking, keeping a fixed number outstanding, until a time (TSC) or a count is reached;
//!   then it drains and checks the last kernel's result against the CPU reference.
//! * [`stop_mid_submission`] (`MODE_STOP_FAULT`, `MODE_STOP_SPIN`): a hostile guest that rings
//!   the doorbell for a long kernel and then stops dead with the work in flight — by a
//!   privileged instruction (a fault the ring-3 guest cannot handle: KVM shutdown) or by
//!   spinning without exits until the VMM's timeout kicks it out of `KVM_RUN`.

use core::fmt::Write;

use alloc::collections::VecDeque;
use gf100::compute::Kernel;
use gpuvm_guest::{Fence, Gpu, MemLocation, PushBuf};

use crate::{abi, bp32, bp64, inl, phase, rdtsc, result, wr64, KvmHal, Serial};

/// The stream's parameters (boot parameters `BP_STREAM_*`).
struct Plan {
    iterations: u64,
    outstanding: usize,
    start_ticks: u64,
    run_ticks: u64,
    count: u64,
}

fn plan(tsc_khz: u64) -> Plan {
    let ms = |v: u32| v as u64 * tsc_khz;
    Plan {
        iterations: bp64(abi::BP_STREAM_ITERS).max(1),
        outstanding: (bp32(abi::BP_STREAM_OUTSTANDING) as usize).clamp(1, 64),
        start_ticks: ms(bp32(abi::BP_STREAM_START_MS)),
        run_ticks: ms(bp32(abi::BP_STREAM_MS)),
        count: bp32(abi::BP_STREAM_COUNT) as u64,
    }
}

/// Waits at the VMM's start gate until every VM of the run has arrived (a port read each
/// millisecond: one exit per read).
pub fn gate(tsc_khz: u64) {
    while inl(abi::PORT_GATE) == 0 {
        let t = rdtsc();
        while rdtsc().wrapping_sub(t) < tsc_khz {
            core::hint::spin_loop();
        }
    }
    phase(abi::PHASE_GATE_OPEN);
}

/// `MODE_STREAM`: result entry 1 is the stream (verified = every kernel completed and the last
/// one's result matched the reference); the header counts kernels. Returns true if verified.
pub fn stream(gpu: &mut Gpu<KvmHal>, tsc_khz: u64) -> bool {
    let p = plan(tsc_khz);
    let fail = |what: &dyn core::fmt::Display| {
        result(1, false, 0, 0, Some(what));
        let _ = writeln!(Serial, "stream: FAILED: {what}");
        false
    };
    let mut ch = match gpu.channel_new() {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let dst = match gpu.buffer_new(ch.vm_mut(), 4096, MemLocation::Vram, true) {
        Ok(b) => b,
        Err(e) => return fail(&e),
    };
    gate(tsc_khz);
    let t0 = rdtsc();
    while rdtsc().wrapping_sub(t0) < p.start_ticks {
        core::hint::spin_loop();
    }
    phase(1);
    let mut outstanding: VecDeque<Fence> = VecDeque::new();
    let (mut submitted, mut completed) = (0u64, 0u64);
    let mut last_seed = 0u32;
    let mut stopped = false;
    loop {
        // Retire what signalled.
        while let Some(&f) = outstanding.front() {
            match gpu.fence_done(&ch, f) {
                Ok(true) => {
                    outstanding.pop_front();
                    completed += 1;
                }
                Ok(false) => break,
                Err(e) => return fail(&e),
            }
        }
        if !stopped
            && ((p.run_ticks != 0 && rdtsc().wrapping_sub(t0) >= p.run_ticks)
                || (p.count != 0 && submitted >= p.count))
        {
            stopped = true;
            phase(abi::PHASE_STREAM_STOP);
        }
        if stopped && outstanding.is_empty() {
            break;
        }
        while !stopped && outstanding.len() < p.outstanding {
            last_seed = 0x9e37_79b9u32.wrapping_mul(submitted as u32 + 1);
            let mut pb = PushBuf::new();
            pb.kernel(&Kernel::Loop {
                dst: dst.va(),
                iterations: p.iterations,
                seed: last_seed,
            });
            match gpu.submit(&mut ch, &pb) {
                Ok(f) => outstanding.push_back(f),
                Err(e) => return fail(&e),
            }
            submitted += 1;
        }
        if stopped {
            // Draining: wait for the oldest instead of spinning on exits.
            if let Some(&f) = outstanding.front() {
                if let Err(e) = gpu.fence_wait(&mut ch, f) {
                    return fail(&e);
                }
            }
        }
    }
    wr64(abi::RESULTS_HEADER + abi::H_KERNELS, completed);
    wr64(abi::RESULTS_HEADER + abi::H_SUBMITTED, submitted);
    let verified = match gpu.buffer_rd32(&dst, 0) {
        Ok(got) => {
            submitted == 0
                || got
                    == gpuvm_guest::reference::loop_expected(
                        last_seed,
                        p.iterations,
                        gpuvm_guest::workloads::LOOP_NAIVE_LIMIT,
                    )
        }
        Err(e) => return fail(&e),
    };
    result(1, verified, completed, 0, None);
    let _ = writeln!(
        Serial,
        "stream: {completed}/{submitted} kernels of {} iterations, {} outstanding, {}",
        p.iterations,
        p.outstanding,
        if verified { "verified" } else { "NOT VERIFIED" }
    );
    let _ = gpu.buffer_free(ch.vm_mut(), dst);
    let _ = gpu.channel_free(ch);
    verified && completed == submitted
}

/// `MODE_STOP_FAULT` / `MODE_STOP_SPIN`: rings the doorbell for one long kernel, then stops
/// dead with it in flight. Returns only if the submission failed.
pub fn stop_mid_submission(gpu: &mut Gpu<KvmHal>, mode: u32) {
    let iterations = bp64(abi::BP_STREAM_ITERS).max(1);
    let mut ch = match gpu.channel_new() {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(Serial, "hostile: no channel: {e}");
            return;
        }
    };
    let Ok(dst) = gpu.buffer_new(ch.vm_mut(), 4096, MemLocation::Vram, false) else {
        return;
    };
    let mut pb = PushBuf::new();
    pb.kernel(&Kernel::Loop {
        dst: dst.va(),
        iterations,
        seed: 1,
    });
    if let Err(e) = gpu.submit(&mut ch, &pb) {
        let _ = writeln!(Serial, "hostile: submit failed: {e}");
        return;
    }
    phase(1);
    if mode == abi::MODE_STOP_SPIN {
        let at = spin_forever as fn() -> ! as usize;
        let _ = writeln!(
            Serial,
            "hostile: doorbell rung for {iterations} iterations; spinning without exits at {at:#x}"
        );
        spin_forever();
    }
    let _ = writeln!(
        Serial,
        "hostile: doorbell rung for {iterations} iterations; executing hlt in ring 3"
    );
    // SAFETY: deliberately faults: `hlt` is privileged, in ring 3 it raises #GP, for which the
    // guest has no handler (the VMM sees a shutdown). Nothing in memory is touched.
    unsafe { core::arch::asm!("hlt", options(nomem, nostack)) };
    let _ = writeln!(Serial, "hostile: still running after hlt");
}

/// Spins without exits for good (`MODE_STOP_SPIN`); its address is printed first, so that the
/// VMM's `final_rip` can be checked against it. Its own function, so that the loop is the
/// whole of it.
#[inline(never)]
fn spin_forever() -> ! {
    loop {
        core::hint::spin_loop();
    }
}
