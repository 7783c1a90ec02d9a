//! The compute engine (PGRAPH, class 0x90C0) as the simulated GF100 models it: the fixed kernels
//! of `gf100::compute` (memset, madd, mmul, fmadd, fmmul, loop) computed on real data read and
//! written through the channel's GPU virtual addresses.
//!
//! Arguments are decoded and validated with `gf100::compute::Kernel::decode`; a rejected launch
//! is a PBDMA ILLEGAL_MTHD error (the caller's job). A launched kernel runs as an
//! [`super::engine::EngineOp`] over its modeled duration: element-wise kernels stream their
//! operands in 64 KiB pieces; the matrix kernels first load `b` (at most 4 MiB at the 1024x1024
//! limit, kept) in 64 KiB pieces, then compute each result row in blocks of ~64 Ki multiply-adds;
//! `loop` writes its one word at the end.
//! A fault stops the kernel where it happened (MMU fault unit PGRAPH, GPC client CTXCTL), when its
//! piece is reached; results written before it stay written. `fmmul` sums k in
//! increasing order with separate f32 multiply and add, so results are bit-exact and
//! reproducible on the guest side — NaN results aside, whose bits are not specified (a guest
//! comparing must treat any NaN as equal).

use gf100::compute::{self as cc, Kernel};

/// Compute method registers of one channel.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct ComputeRegs {
    kernel: u32,
    args: [u32; cc::MAX_ARGS],
}

/// A method the compute class does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UnknownMethod;

impl ComputeRegs {
    /// Stores a method; returns `Ok(true)` for LAUNCH.
    pub(crate) fn method(&mut self, mthd: u32, data: u32) -> Result<bool, UnknownMethod> {
        let arg_end = cc::ARG + 4 * cc::MAX_ARGS as u32;
        match mthd {
            cc::KERNEL => self.kernel = data,
            m if (cc::ARG..arg_end).contains(&m) => self.args[((m - cc::ARG) / 4) as usize] = data,
            cc::LAUNCH => return Ok(true),
            _ => return Err(UnknownMethod),
        }
        Ok(false)
    }

    /// The launch the registers describe.
    pub(crate) fn kernel(&self) -> Result<Kernel, cc::KernelError> {
        Kernel::decode(self.kernel, &self.args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::CostModel;
    use crate::engine::{run_to_end, EngineOp};
    use crate::mmu::{VaFault, Vspace};
    use crate::Core;

    /// Runs `k` in `vs` to its end: its duration, or its fault.
    fn run(core: &mut Core, vs: &Vspace, k: &Kernel) -> Result<u64, VaFault> {
        let mut op = EngineOp::kernel(core, k, *vs, 0, 0);
        run_to_end(core, &mut op)
    }

    fn read_words(c: &mut Core, vs: &Vspace, va: u64, n: usize) -> Result<Vec<u32>, VaFault> {
        let mut b = vec![0u8; n * 4];
        c.read_va(vs, va, &mut b)?;
        Ok(b.chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect())
    }
    use gf100::mmu::{Pde, PtRef, PtSize, Pte};
    use gf100::Target;

    /// A core whose VA space maps [0, 1 MiB) to VRAM [1 MiB, 2 MiB).
    fn setup() -> (Core, Vspace) {
        let mut c = Core::new(8 << 20, CostModel::quadro_6000());
        let spt = 0x10_0000 - 0x8_0000;
        let w =
            |c: &mut Core, a: u64, v: u64| assert!(c.mem.write(Target::Vram, a, &v.to_le_bytes()));
        w(
            &mut c,
            0,
            Pde {
                small: Some(PtRef {
                    addr: spt,
                    target: Target::Vram,
                    vol: false,
                }),
                large: None,
                size: PtSize::Full,
            }
            .encode(),
        );
        for p in 0..256u64 {
            w(
                &mut c,
                spt + p * 8,
                Pte::new(0x10_0000 + p * 0x1000, Target::Vram).encode(),
            );
        }
        (
            c,
            Vspace {
                pd: Some((0, Target::Vram)),
                limit: u64::MAX,
            },
        )
    }

    fn put(c: &mut Core, vs: &Vspace, va: u64, words: &[u32]) {
        let b: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(c.write_va(vs, va, &b), Ok(()));
    }

    fn get(c: &mut Core, vs: &Vspace, va: u64, n: usize) -> Vec<u32> {
        read_words(c, vs, va, n).unwrap_or_default()
    }

    #[test]
    fn mmul_and_fmmul_match_a_reference() {
        let (mut c, vs) = setup();
        let a = [1u32, 2, 3, 4];
        let b = [5u32, 6, 7, 8];
        put(&mut c, &vs, 0x1000, &a);
        put(&mut c, &vs, 0x2000, &b);
        let t = run(
            &mut c,
            &vs,
            &Kernel::Mmul {
                a: 0x1000,
                b: 0x2000,
                c: 0x3000,
                n: 2,
            },
        );
        assert!(t.is_ok_and(|t| t >= c.cost.kernel_launch_ns));
        assert_eq!(get(&mut c, &vs, 0x3000, 4), vec![19, 22, 43, 50]);
        let fa: Vec<u32> = [1.5f32, -2.0, 0.25, 4.0]
            .iter()
            .map(|f| f.to_bits())
            .collect();
        let fb: Vec<u32> = [2.0f32, 1.0, 3.0, -0.5]
            .iter()
            .map(|f| f.to_bits())
            .collect();
        put(&mut c, &vs, 0x1000, &fa);
        put(&mut c, &vs, 0x2000, &fb);
        assert!(run(
            &mut c,
            &vs,
            &Kernel::Fmmul {
                a: 0x1000,
                b: 0x2000,
                c: 0x3000,
                n: 2
            }
        )
        .is_ok());
        let want: Vec<u32> = [
            1.5f32 * 2.0 + -2.0 * 3.0,
            1.5 * 1.0 + -2.0 * -0.5,
            0.25 * 2.0 + 4.0 * 3.0,
            0.25 * 1.0 + 4.0 * -0.5,
        ]
        .iter()
        .map(|f| f.to_bits())
        .collect();
        assert_eq!(get(&mut c, &vs, 0x3000, 4), want);
    }

    #[test]
    fn elementwise_kernels_cross_pages_and_fault_midway() {
        let (mut c, vs) = setup();
        let n = 3000u32; // 12000 bytes: three pages per operand
        let a: Vec<u32> = (0..n).collect();
        let b: Vec<u32> = (0..n).map(|i| 0u32.wrapping_sub(i)).collect();
        put(&mut c, &vs, 0x1_0000, &a);
        put(&mut c, &vs, 0x2_0000, &b);
        assert!(run(
            &mut c,
            &vs,
            &Kernel::Madd {
                a: 0x1_0000,
                b: 0x2_0000,
                c: 0x3_0000,
                n
            }
        )
        .is_ok());
        assert!(
            get(&mut c, &vs, 0x3_0000, n as usize)
                .iter()
                .all(|&v| v == 0),
            "wrapping add"
        );
        let f = run(
            &mut c,
            &vs,
            &Kernel::Memset {
                dst: 0xf_f000,
                bytes: 0x2000,
                value: 7,
            },
        );
        assert_eq!(f.map_err(|f| f.va), Err(0x10_0000));
        assert_eq!(get(&mut c, &vs, 0xf_f000, 1024), vec![7; 1024]);
    }

    #[test]
    fn launch_scan_predicts_the_traffic_the_pieces_cause() {
        let (mut c, vs) = setup();
        for k in [
            Kernel::Mmul {
                a: 0x1000,
                b: 0x2000,
                c: 0x3000,
                n: 16,
            },
            Kernel::Madd {
                a: 0x1_0000,
                b: 0x2_0000,
                c: 0x3_0000,
                n: 20_000,
            },
            Kernel::Memset {
                dst: 0x4_0000,
                bytes: 0x2_1000,
                value: 1,
            },
        ] {
            let mut op = EngineOp::kernel(&c, &k, vs, 0, 0);
            c.mem.take_traffic();
            assert!(run_to_end(&mut c, &mut op).is_ok());
            assert_eq!(op.scanned_traffic(), c.mem.take_traffic(), "{k:?}");
        }
    }

    #[test]
    fn offloaded_blocks_land_only_in_the_operation_still_at_that_piece() {
        use crate::budget::Budget;
        use crate::engine::{EngineWrites, Step};
        let (mut c, vs) = setup();
        let n = 260u32; // 2 blocks per result row
        let a: Vec<u32> = (0..n * n).map(|i| i % 7).collect();
        let b: Vec<u32> = (0..n * n).map(|i| i % 5 + 1).collect();
        put(&mut c, &vs, 0x1000, &a);
        put(&mut c, &vs, 0x4_4000, &b);
        let k = Kernel::Mmul {
            a: 0x1000,
            b: 0x4_4000,
            c: 0x8_7000,
            n,
        };
        let mut op = EngineOp::kernel(&c, &k, vs, 0, 0);
        op.serial = 1;
        let mut budget = Budget::default();
        // As the engine worker does: loads run, the first block is handed out.
        let block = loop {
            budget.new_worker_batch(u64::MAX);
            match op.progress(&mut c, 0, u64::MAX, EngineWrites::OverDuration, &mut budget) {
                Step::Offload(o) => break o,
                Step::Deferred | Step::Waiting => {}
                other => panic!("{other:?}"),
            }
        };
        let data = block.block.compute();
        // An operation launched after this one was aborted does not take its results...
        let mut other = EngineOp::kernel(&c, &k, vs, 0, 0);
        other.serial = 2;
        assert_eq!(other.commit(&mut c, &block, &data, &mut budget), Ok(()));
        assert_eq!(get(&mut c, &vs, 0x8_7000, 4), vec![0; 4]);
        // ...the operation it belongs to does, once.
        assert_eq!(op.commit(&mut c, &block, &data, &mut budget), Ok(()));
        let want: u32 = (0..n as usize).map(|k| a[k] * b[k * n as usize]).sum();
        assert_eq!(get(&mut c, &vs, 0x8_7000, 1), vec![want]);
        put(&mut c, &vs, 0x8_7000, &[0]);
        assert_eq!(op.commit(&mut c, &block, &data, &mut budget), Ok(()));
        assert_eq!(get(&mut c, &vs, 0x8_7000, 1), vec![0], "a block lands once");
        assert!(budget.stats.worker_pieces > 0);
    }

    #[test]
    fn a_completed_matrix_kernel_hands_its_staging_to_the_next() {
        let (mut c, vs) = setup();
        let n = 40u32;
        let words = (n * n) as usize;
        let k = |c_va| Kernel::Mmul {
            a: 0x1000,
            b: 0x3000,
            c: c_va,
            n,
        };
        let mut first = EngineOp::kernel(&c, &k(0x5000), vs, 0, 0);
        let mut second = EngineOp::kernel(&c, &k(0x7000), vs, 0, 0);
        let (a, b): (Vec<u32>, Vec<u32>) = ((0..words as u32).collect(), vec![2; words]);
        put(&mut c, &vs, 0x1000, &a);
        put(&mut c, &vs, 0x3000, &b);
        assert!(run_to_end(&mut c, &mut first).is_ok());
        assert_eq!(
            c.matmul_stage.capacity(),
            0,
            "the first kernel still holds it"
        );
        first.recycle(&mut c);
        let stage = (c.matmul_stage.as_ptr(), c.matmul_stage.capacity());
        assert!(stage.1 >= words);
        // The next kernel loads `b` into the same memory, with other values this time.
        put(&mut c, &vs, 0x3000, &vec![3; words]);
        assert!(run_to_end(&mut c, &mut second).is_ok());
        second.recycle(&mut c);
        assert_eq!((c.matmul_stage.as_ptr(), c.matmul_stage.capacity()), stage);
        let row_sum = |i: u32, m: u32| (0..n).map(|k| (i * n + k) * m).sum::<u32>();
        assert_eq!(get(&mut c, &vs, 0x5000, 1), vec![row_sum(0, 2)]);
        let last = 0x7000 + u64::from(n * n - 1) * 4;
        assert_eq!(get(&mut c, &vs, last, 1), vec![row_sum(n - 1, 3)]);
    }

    #[test]
    fn loop_writes_the_closed_form_result() {
        let (mut c, vs) = setup();
        let t = run(
            &mut c,
            &vs,
            &Kernel::Loop {
                dst: 0x40,
                iterations: 1000,
                seed: 3,
            },
        );
        assert_eq!(t, Ok(c.cost.loop_kernel(1000)));
        let mut x = 3u32;
        for _ in 0..1000 {
            x = cc::loop_step(x);
        }
        assert_eq!(get(&mut c, &vs, 0x40, 1), vec![x]);
    }

    #[test]
    fn compute_methods() {
        let mut r = ComputeRegs::default();
        assert_eq!(r.method(cc::KERNEL, 5), Ok(false));
        assert_eq!(r.method(cc::ARG + 4 * 14, 1), Ok(false));
        assert_eq!(r.method(cc::ARG + 4 * 15, 1), Err(UnknownMethod));
        assert_eq!(r.method(cc::LAUNCH, 0), Ok(true));
        assert!(matches!(r.kernel(), Ok(Kernel::Loop { .. })));
        r.method(cc::KERNEL, 99).ok();
        assert_eq!(r.kernel(), Err(cc::KernelError::UnknownKernel(99)));
    }
}
