//! Host memory of this process, for the scale and soak experiments: resident set size split
//! the way `/proc/self/status` splits it, and the simulated GPU's VRAM resident in it.
//!
//! The simulated VRAM is a shared memfd (`gpuvm::phys::sim`), so its pages count as
//! `RssShmem`; guest RAM and every structure of the device model are anonymous memory
//! (`RssAnon`). "Host memory per VM, excluding its VRAM slice" is therefore the growth of
//! `RssAnon` (which still includes the guest RAM the VM's workloads touched).

/// One reading.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemSample {
    /// `VmRSS`, bytes (0 where `/proc` is unavailable).
    pub rss: u64,
    /// `RssAnon`, bytes.
    pub rss_anon: u64,
    /// `RssShmem`, bytes (the simulated VRAM lives here).
    pub rss_shmem: u64,
    /// Bytes of VRAM the simulated GPU has allocated (its own 64 KiB chunk accounting).
    pub vram_resident: u64,
}

impl MemSample {
    /// Reads `/proc/self/status` and, if given, the simulated GPU's resident VRAM.
    pub fn now(sim: Option<&gpuvm_sim::SimGpu>) -> MemSample {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .map_or(0, |kib| kib * 1024)
        };
        MemSample {
            rss: field("VmRSS:"),
            rss_anon: field("RssAnon:"),
            rss_shmem: field("RssShmem:"),
            vram_resident: sim.map_or(0, |s| s.vram_resident_bytes()),
        }
    }
}

/// Least-squares slope of `y` against `x` (`None` with fewer than two distinct `x`).
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    Some(sxy / sxx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_and_fits_a_line() {
        let m = MemSample::now(None);
        assert!(m.rss > 0 && m.rss_anon > 0 && m.rss_anon <= m.rss, "{m:?}");
        let s = slope(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]).unwrap();
        assert!((s - 2.0).abs() < 1e-9);
        assert_eq!(slope(&[(1.0, 1.0), (1.0, 2.0)]), None);
        assert_eq!(slope(&[]), None);
    }
}
