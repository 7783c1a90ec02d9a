//! The cost model: how long each piece of GPU work takes on the simulated Quadro 6000.
//!
//! Every operation is `fixed overhead + max(VRAM bytes / VRAM bandwidth, system-memory bytes /
//! PCIe bandwidth, arithmetic / throughput)`: an operation is bound by whichever resource it
//! saturates. Defaults follow the Quadro 6000's data sheet (GF100, 448 CUDA cores at 1.15 GHz,
//! 144 GB/s GDDR5, PCIe 2.0 x16); fixed overheads are estimates. The derivation of every number
//! is in `docs/sim-cost-model.md`.

use super::mem::Traffic;

/// Durations and rates of the simulated GPU. All rates are per second; a rate of 0 means
/// "infinitely fast" (that term costs nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostModel {
    /// Fixed cost of fetching one GPFIFO entry (ns).
    pub gpfifo_entry_ns: u64,
    /// Cost of each pushbuffer dword the front end decodes (ns).
    pub pushbuffer_dword_ns: u64,
    /// Fixed cost of a copy-engine LAUNCH_DMA (ns).
    pub copy_launch_ns: u64,
    /// Fixed cost of a compute kernel launch (ns).
    pub kernel_launch_ns: u64,
    /// VRAM bandwidth, bytes per second (reads and writes together).
    pub vram_bytes_per_s: u64,
    /// PCIe bandwidth for system-memory accesses, bytes per second.
    pub pcie_bytes_per_s: u64,
    /// Single-precision throughput, floating-point operations per second (an FMA counts 2).
    pub f32_flops_per_s: u64,
    /// 32-bit integer throughput, operations per second (an integer multiply-add counts 2).
    pub u32_ops_per_s: u64,
    /// Cost of one iteration of the `loop` kernel, in picoseconds.
    pub loop_iteration_ps: u64,
    /// Cost of resuming a channel that a preempt (KICK) switched out in the middle of a
    /// GPFIFO entry: restoring its PBDMA state and engine context (ns). At entry boundaries the
    /// context is loaded with the entry's fetch and costs nothing extra.
    pub ctxsw_ns: u64,
}

impl CostModel {
    /// The Quadro 6000 defaults (see `docs/sim-cost-model.md`).
    pub const fn quadro_6000() -> CostModel {
        CostModel {
            gpfifo_entry_ns: 200,
            pushbuffer_dword_ns: 2,
            copy_launch_ns: 2_000,
            kernel_launch_ns: 4_000,
            vram_bytes_per_s: 144_000_000_000,
            pcie_bytes_per_s: 6_000_000_000,
            f32_flops_per_s: 1_030_000_000_000,
            u32_ops_per_s: 515_000_000_000,
            loop_iteration_ps: 17_400,
            ctxsw_ns: 20_000,
        }
    }

    /// A model in which everything takes no time (work completes as soon as it is submitted).
    pub const fn instant() -> CostModel {
        CostModel {
            gpfifo_entry_ns: 0,
            pushbuffer_dword_ns: 0,
            copy_launch_ns: 0,
            kernel_launch_ns: 0,
            vram_bytes_per_s: 0,
            pcie_bytes_per_s: 0,
            f32_flops_per_s: 0,
            u32_ops_per_s: 0,
            loop_iteration_ps: 0,
            ctxsw_ns: 0,
        }
    }

    /// Fetching a GPFIFO entry and its pushbuffer segment of `dwords` dwords.
    pub fn gpfifo_entry(&self, dwords: u32) -> u64 {
        self.gpfifo_entry_ns
            .saturating_add(self.pushbuffer_dword_ns.saturating_mul(dwords as u64))
    }

    /// Time to move `traffic` through memory: the slower of the VRAM and PCIe terms.
    pub(crate) fn memory(&self, traffic: Traffic) -> u64 {
        rate_ns(traffic.vram as u128, self.vram_bytes_per_s)
            .max(rate_ns(traffic.sys as u128, self.pcie_bytes_per_s))
    }

    /// A copy-engine operation that moved `traffic`.
    pub(crate) fn copy(&self, traffic: Traffic) -> u64 {
        self.copy_launch_ns.saturating_add(self.memory(traffic))
    }

    /// A compute kernel that moved `traffic` and did `f32_flops` + `u32_ops` of arithmetic.
    pub(crate) fn kernel(&self, traffic: Traffic, f32_flops: u128, u32_ops: u128) -> u64 {
        let arith = rate_ns(f32_flops, self.f32_flops_per_s)
            .saturating_add(rate_ns(u32_ops, self.u32_ops_per_s));
        self.kernel_launch_ns
            .saturating_add(self.memory(traffic).max(arith))
    }

    /// The `loop` kernel with `iterations` iterations (its memory traffic is one word).
    pub fn loop_kernel(&self, iterations: u64) -> u64 {
        let ns = (iterations as u128 * self.loop_iteration_ps as u128).div_ceil(1000);
        self.kernel_launch_ns.saturating_add(saturate(ns))
    }
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel::quadro_6000()
    }
}

/// `amount / per_second` in nanoseconds, rounded up; 0 if the rate is 0 (infinite).
fn rate_ns(amount: u128, per_second: u64) -> u64 {
    if per_second == 0 {
        return 0;
    }
    saturate((amount * 1_000_000_000).div_ceil(per_second as u128))
}

fn saturate(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vram_copy_is_bandwidth_bound() {
        let c = CostModel::quadro_6000();
        // 144 MB moved in VRAM at 144 GB/s = 1 ms, plus the launch overhead.
        let t = c.copy(Traffic {
            vram: 144_000_000,
            sys: 0,
        });
        assert_eq!(t, 2_000 + 1_000_000);
    }

    #[test]
    fn sysram_copy_is_pcie_bound() {
        let c = CostModel::quadro_6000();
        let t = c.copy(Traffic {
            vram: 6_000_000,
            sys: 6_000_000,
        });
        assert_eq!(t, 2_000 + 1_000_000, "6 MB over PCIe at 6 GB/s = 1 ms");
    }

    #[test]
    fn kernels_take_the_larger_of_memory_and_arithmetic() {
        let c = CostModel::quadro_6000();
        // 1.03e9 flops = 1 ms of arithmetic; tiny traffic.
        assert_eq!(
            c.kernel(Traffic { vram: 12, sys: 0 }, 1_030_000_000, 0),
            4_000 + 1_000_000
        );
        // 144 MB of traffic dominates a few flops.
        assert_eq!(
            c.kernel(
                Traffic {
                    vram: 144_000_000,
                    sys: 0
                },
                10,
                0
            ),
            4_000 + 1_000_000
        );
    }

    #[test]
    fn loop_scales_with_iterations_and_saturates() {
        let c = CostModel::quadro_6000();
        assert_eq!(c.loop_kernel(1000), 4_000 + 17_400);
        assert_eq!(c.loop_kernel(u64::MAX), u64::MAX);
        assert_eq!(CostModel::instant().loop_kernel(u64::MAX), 0);
        assert_eq!(
            CostModel::instant().copy(Traffic {
                vram: 1 << 40,
                sys: 1 << 40
            }),
            0
        );
    }
}
