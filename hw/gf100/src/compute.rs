//! The compute class 0x90C0 (FERMI_COMPUTE_A) as the simulated GF100 models it.
//!
//! **MODEL, not hardware.** A real Fermi runs shader programs in its own ISA, which is out of
//! scope for this project. The simulated GPU instead offers a documented, fixed set of kernels that
//! really read and write memory through the channel's GPU virtual addresses. A guest binds the
//! class with the real SET_OBJECT sequence (class 0x90c0 on PGRAPH), then selects a kernel with
//! [`KERNEL`], sets up to [`MAX_ARGS`] argument words with [`ARG`], and starts it with [`LAUNCH`].
//! These three methods sit in a range of the class the project's driver and simulator reserve for
//! this purpose; their offsets are this project's choice.
//!
//! The kernels mirror Gdev's microbenchmarks (`gdev/test/cuda/user/{madd,mmul,fmadd,fmmul,loop}`)
//! plus a memset. Arguments that are 40-bit VAs take two words, upper then lower (the convention of
//! the real SEMAPHORE_A/B and OFFSET_*_UPPER/LOWER methods).

/// Class number (FERMI_COMPUTE_A).
pub const CLASS: u32 = 0x90c0;
/// MODEL: selects the kernel (a [`KernelId`] value).
pub const KERNEL: u32 = 0x0400;
/// MODEL: argument word i at `ARG + 4*i`, i < [`MAX_ARGS`].
pub const ARG: u32 = 0x0404;
/// Number of argument words.
pub const MAX_ARGS: usize = 15;
/// MODEL: starts the selected kernel with the current arguments (data ignored).
pub const LAUNCH: u32 = 0x0480;

/// Largest matrix dimension accepted by MMUL/FMMUL (bounds the simulator's work per launch).
pub const MAX_MATRIX_DIM: u32 = 1024;
/// Largest element count accepted by MADD/FMADD (64 MiB per operand).
pub const MAX_ELEMENTS: u32 = 1 << 24;
/// Largest byte count accepted by MEMSET.
pub const MAX_MEMSET_BYTES: u32 = 1 << 28;

/// Kernel identifiers (the value written to [`KERNEL`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum KernelId {
    /// Fill memory with a 32-bit pattern.
    Memset = 0,
    /// Element-wise u32 add.
    Madd = 1,
    /// u32 matrix multiply.
    Mmul = 2,
    /// Element-wise f32 add.
    Fmadd = 3,
    /// f32 matrix multiply.
    Fmmul = 4,
    /// A long-running scalar loop (Gdev `loop`).
    Loop = 5,
}

/// A kernel launch with its arguments.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kernel {
    /// `dst[i] = value` for `bytes / 4` words.
    Memset {
        /// Destination VA (4-byte aligned).
        dst: u64,
        /// Byte count (multiple of 4, at most [`MAX_MEMSET_BYTES`]).
        bytes: u32,
        /// Fill pattern.
        value: u32,
    },
    /// `c[i] = a[i] + b[i]` (u32, wrapping) for `n` elements.
    Madd {
        /// First operand VA.
        a: u64,
        /// Second operand VA.
        b: u64,
        /// Result VA.
        c: u64,
        /// Element count.
        n: u32,
    },
    /// `c = a * b` for `n`x`n` row-major u32 matrices (wrapping arithmetic).
    Mmul {
        /// First operand VA.
        a: u64,
        /// Second operand VA.
        b: u64,
        /// Result VA.
        c: u64,
        /// Dimension.
        n: u32,
    },
    /// `c[i] = a[i] + b[i]` (f32) for `n` elements.
    Fmadd {
        /// First operand VA.
        a: u64,
        /// Second operand VA.
        b: u64,
        /// Result VA.
        c: u64,
        /// Element count.
        n: u32,
    },
    /// `c = a * b` for `n`x`n` row-major f32 matrices, summing k in increasing order.
    Fmmul {
        /// First operand VA.
        a: u64,
        /// Second operand VA.
        b: u64,
        /// Result VA.
        c: u64,
        /// Dimension.
        n: u32,
    },
    /// Runs [`loop_step`] `iterations` times from `seed` and writes the final u32 to `dst`.
    Loop {
        /// Result VA.
        dst: u64,
        /// Iteration count.
        iterations: u64,
        /// Start value.
        seed: u32,
    },
}

/// Why a launch was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelError {
    /// The KERNEL value names no kernel.
    UnknownKernel(u32),
    /// A size argument is zero, misaligned or beyond the model's limit.
    BadSize,
}

const fn va(hi: u32, lo: u32) -> u64 {
    ((hi & 0xff) as u64) << 32 | lo as u64
}

const fn split(v: u64) -> (u32, u32) {
    ((v >> 32) as u32 & 0xff, v as u32)
}

impl Kernel {
    /// The kernel's id.
    pub const fn id(&self) -> KernelId {
        match self {
            Kernel::Memset { .. } => KernelId::Memset,
            Kernel::Madd { .. } => KernelId::Madd,
            Kernel::Mmul { .. } => KernelId::Mmul,
            Kernel::Fmadd { .. } => KernelId::Fmadd,
            Kernel::Fmmul { .. } => KernelId::Fmmul,
            Kernel::Loop { .. } => KernelId::Loop,
        }
    }

    /// The argument words the driver writes to ARG[0..]; returns the words and how many are used.
    pub const fn encode_args(&self) -> ([u32; MAX_ARGS], usize) {
        let mut w = [0u32; MAX_ARGS];
        let used = match *self {
            Kernel::Memset { dst, bytes, value } => {
                let (h, l) = split(dst);
                w[0] = h;
                w[1] = l;
                w[2] = bytes;
                w[3] = value;
                4
            }
            Kernel::Madd { a, b, c, n }
            | Kernel::Mmul { a, b, c, n }
            | Kernel::Fmadd { a, b, c, n }
            | Kernel::Fmmul { a, b, c, n } => {
                let (ah, al) = split(a);
                let (bh, bl) = split(b);
                let (ch, cl) = split(c);
                w[0] = ah;
                w[1] = al;
                w[2] = bh;
                w[3] = bl;
                w[4] = ch;
                w[5] = cl;
                w[6] = n;
                7
            }
            Kernel::Loop {
                dst,
                iterations,
                seed,
            } => {
                let (h, l) = split(dst);
                w[0] = h;
                w[1] = l;
                w[2] = (iterations >> 32) as u32;
                w[3] = iterations as u32;
                w[4] = seed;
                5
            }
        };
        (w, used)
    }

    /// Decodes and validates a launch from the KERNEL value and the argument words.
    pub const fn decode(kernel: u32, w: &[u32; MAX_ARGS]) -> Result<Kernel, KernelError> {
        let k = match kernel {
            0 => Kernel::Memset {
                dst: va(w[0], w[1]),
                bytes: w[2],
                value: w[3],
            },
            1 => Kernel::Madd {
                a: va(w[0], w[1]),
                b: va(w[2], w[3]),
                c: va(w[4], w[5]),
                n: w[6],
            },
            2 => Kernel::Mmul {
                a: va(w[0], w[1]),
                b: va(w[2], w[3]),
                c: va(w[4], w[5]),
                n: w[6],
            },
            3 => Kernel::Fmadd {
                a: va(w[0], w[1]),
                b: va(w[2], w[3]),
                c: va(w[4], w[5]),
                n: w[6],
            },
            4 => Kernel::Fmmul {
                a: va(w[0], w[1]),
                b: va(w[2], w[3]),
                c: va(w[4], w[5]),
                n: w[6],
            },
            5 => Kernel::Loop {
                dst: va(w[0], w[1]),
                iterations: (w[2] as u64) << 32 | w[3] as u64,
                seed: w[4],
            },
            other => return Err(KernelError::UnknownKernel(other)),
        };
        let ok = match k {
            Kernel::Memset { bytes, .. } => {
                bytes != 0 && bytes % 4 == 0 && bytes <= MAX_MEMSET_BYTES
            }
            Kernel::Madd { n, .. } | Kernel::Fmadd { n, .. } => n != 0 && n <= MAX_ELEMENTS,
            Kernel::Mmul { n, .. } | Kernel::Fmmul { n, .. } => n != 0 && n <= MAX_MATRIX_DIM,
            Kernel::Loop { .. } => true,
        };
        if ok {
            Ok(k)
        } else {
            Err(KernelError::BadSize)
        }
    }
}

/// LCG multiplier of the loop kernel (Numerical Recipes' `ranqd1`).
pub const LOOP_MUL: u32 = 1_664_525;
/// LCG increment of the loop kernel.
pub const LOOP_INC: u32 = 1_013_904_223;

/// One step of the loop kernel: `x * LOOP_MUL + LOOP_INC (mod 2^32)`.
pub const fn loop_step(x: u32) -> u32 {
    x.wrapping_mul(LOOP_MUL).wrapping_add(LOOP_INC)
}

/// The loop kernel's result after `iterations` steps from `seed`, in O(log iterations) steps by
/// composing the affine map (so a long modeled kernel costs the simulator nothing).
pub const fn loop_result(seed: u32, iterations: u64) -> u32 {
    // x -> a*x + c; composing with itself gives a^2*x + (a*c + c).
    let (mut acc_a, mut acc_c) = (1u32, 0u32);
    let (mut a, mut c) = (LOOP_MUL, LOOP_INC);
    let mut n = iterations;
    while n > 0 {
        if n & 1 == 1 {
            acc_c = acc_c.wrapping_mul(a).wrapping_add(c);
            acc_a = acc_a.wrapping_mul(a);
        }
        c = c.wrapping_mul(a).wrapping_add(c);
        a = a.wrapping_mul(a);
        n >>= 1;
    }
    acc_a.wrapping_mul(seed).wrapping_add(acc_c)
}
