//! On-CPU time of this process's threads, for the scale experiment: how much of a measured span
//! a thread (the simulated GPU's engine worker) spent running, from
//! `/proc/self/task/<tid>/schedstat` (its first field: nanoseconds on a CPU). Where `/proc` is
//! unavailable every reading is zero.

/// Nanoseconds on a CPU, summed over this process's threads named `name` (`comm`, as
/// `std::thread::Builder::name` set it, truncated by the kernel to 15 bytes).
pub fn thread_cpu_ns(name: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    let comm_of = |dir: &std::path::Path| std::fs::read_to_string(dir.join("comm"));
    let want = &name.as_bytes()[..name.len().min(15)];
    tasks
        .flatten()
        .map(|t| t.path())
        .filter(|dir| comm_of(dir).is_ok_and(|c| c.trim_end().as_bytes() == want))
        .filter_map(|dir| std::fs::read_to_string(dir.join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// CPU time (user and system) of this whole process so far, threads that ended included, ns.
pub fn process_cpu_ns() -> u64 {
    match nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let ns = |t: nix::sys::time::TimeVal| {
                (t.tv_sec() as u64).saturating_mul(1_000_000_000) + t.tv_usec() as u64 * 1_000
            };
            ns(u.user_time()) + ns(u.system_time())
        }
        Err(_) => 0,
    }
}

/// CPU use over a measured span.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SpanCpu {
    /// CPU time of the whole process, ns.
    pub process_ns: u64,
    /// On-CPU time of the simulated GPU's engine worker thread, ns.
    pub engine_worker_ns: u64,
}

impl SpanCpu {
    /// A reading now.
    pub fn now() -> SpanCpu {
        SpanCpu {
            process_ns: process_cpu_ns(),
            engine_worker_ns: thread_cpu_ns(gpuvm_sim::ENGINE_THREAD_NAME),
        }
    }

    /// What was used since `earlier`.
    pub fn since(&self, earlier: &SpanCpu) -> SpanCpu {
        SpanCpu {
            process_ns: self.process_ns.saturating_sub(earlier.process_ns),
            engine_worker_ns: self
                .engine_worker_ns
                .saturating_sub(earlier.engine_worker_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_named_thread_is_found_and_an_absent_one_reads_zero() {
        let on_cpu = std::thread::Builder::new()
            .name("cpu-test-spin".into())
            .spawn(|| {
                let t = std::time::Instant::now();
                let mut x = 0u64;
                while t.elapsed() < std::time::Duration::from_millis(20) {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                thread_cpu_ns("cpu-test-spin")
            })
            .expect("spawn")
            .join()
            .expect("join");
        if std::path::Path::new("/proc/self/task").exists() {
            // It spun for 20 ms of wall time; on a loaded machine it ran for less, never 0.
            assert!(on_cpu > 0, "the spinning thread's own CPU time read as 0");
        }
        assert_eq!(thread_cpu_ns("no-such-thread-x"), 0);
        let a = SpanCpu::now();
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(5) {
            std::hint::black_box(0);
        }
        assert!(
            SpanCpu::now().since(&a).process_ns > 0,
            "5 ms of spinning used no CPU time"
        );
    }
}
