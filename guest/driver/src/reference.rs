//! CPU references for the workloads, computed independently of the GPU model: input generators
//! and the expected results, in the evaluation order the MODEL compute class documents
//! (`gf100::compute`: matrix products sum over k in increasing order, u32 arithmetic wraps).

use alloc::vec::Vec;

use gf100::compute::{LOOP_INC, LOOP_MUL};

/// A small deterministic generator (xorshift64*), so inputs are reproducible.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is replaced by a fixed non-zero value).
    pub fn new(seed: u64) -> Rng {
        Rng(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// Next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }

    /// Next f32 in [-1, 1) with 24 significant bits (exactly representable).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 / (1u32 << 23) as f32 - 1.0
    }
}

/// `n` random u32 words.
pub fn gen_u32(seed: u64, n: usize) -> Vec<u32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.next_u32()).collect()
}

/// `n` random f32 values, as their bit patterns.
pub fn gen_f32_bits(seed: u64, n: usize) -> Vec<u32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.next_f32().to_bits()).collect()
}

/// `c[i] = a[i] + b[i]` (wrapping).
pub fn madd(a: &[u32], b: &[u32]) -> Vec<u32> {
    a.iter().zip(b).map(|(x, y)| x.wrapping_add(*y)).collect()
}

/// `c[i] = a[i] + b[i]` on f32 bit patterns.
pub fn fmadd(a: &[u32], b: &[u32]) -> Vec<u32> {
    a.iter()
        .zip(b)
        .map(|(x, y)| (f32::from_bits(*x) + f32::from_bits(*y)).to_bits())
        .collect()
}

/// Row `i` of the u32 matrix product of row-major `n`x`n` matrices (wrapping).
pub fn mmul_row(a: &[u32], b: &[u32], n: usize, i: usize) -> Vec<u32> {
    (0..n)
        .map(|j| {
            let mut acc = 0u32;
            for k in 0..n {
                acc = acc.wrapping_add(a[i * n + k].wrapping_mul(b[k * n + j]));
            }
            acc
        })
        .collect()
}

/// Row `i` of the f32 matrix product, summing k in increasing order from 0.0 with separate
/// multiply and add (no fused multiply-add), as bit patterns.
pub fn fmmul_row(a: &[u32], b: &[u32], n: usize, i: usize) -> Vec<u32> {
    (0..n)
        .map(|j| {
            let mut acc = 0.0f32;
            for k in 0..n {
                let p = f32::from_bits(a[i * n + k]) * f32::from_bits(b[k * n + j]);
                acc += p;
            }
            acc.to_bits()
        })
        .collect()
}

/// The rows a matrix check verifies: all of them when `n^3` is at most `budget` multiply-adds,
/// else an evenly spread sample (always including the first and last row).
pub fn check_rows(n: usize, budget: u64) -> Vec<usize> {
    let per_row = (n as u64).saturating_mul(n as u64).max(1);
    let rows = (budget / per_row).max(2).min(n as u64) as usize;
    if rows >= n {
        return (0..n).collect();
    }
    let mut v: Vec<usize> = (0..rows).map(|r| r * (n - 1) / (rows - 1)).collect();
    v.dedup();
    v
}

/// Naive iteration of the loop kernel's step (`x * LOOP_MUL + LOOP_INC`).
pub fn loop_naive(seed: u32, iterations: u64) -> u32 {
    let mut x = seed;
    for _ in 0..iterations {
        x = x.wrapping_mul(LOOP_MUL).wrapping_add(LOOP_INC);
    }
    x
}

/// The loop kernel's result by repeated squaring of the 2x2 matrix `[[m, c], [0, 1]]` acting on
/// `(x, 1)` (an independent derivation from `gf100::compute::loop_result`).
pub fn loop_matrix(seed: u32, iterations: u64) -> u32 {
    type M = [[u32; 2]; 2];
    fn mul(p: &M, q: &M) -> M {
        let mut r = [[0u32; 2]; 2];
        for (i, row) in r.iter_mut().enumerate() {
            for (j, cell) in row.iter_mut().enumerate() {
                *cell = p[i][0]
                    .wrapping_mul(q[0][j])
                    .wrapping_add(p[i][1].wrapping_mul(q[1][j]));
            }
        }
        r
    }
    let mut result: M = [[1, 0], [0, 1]];
    let mut base: M = [[LOOP_MUL, LOOP_INC], [0, 1]];
    let mut e = iterations;
    while e > 0 {
        if e & 1 == 1 {
            result = mul(&base, &result);
        }
        base = mul(&base, &base);
        e >>= 1;
    }
    result[0][0].wrapping_mul(seed).wrapping_add(result[0][1])
}

/// The loop reference: naive iteration up to `naive_limit` iterations, the matrix method above.
pub fn loop_expected(seed: u32, iterations: u64, naive_limit: u64) -> u32 {
    if iterations <= naive_limit {
        loop_naive(seed, iterations)
    } else {
        loop_matrix(seed, iterations)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_methods_agree_with_each_other_and_the_model() {
        for (seed, it) in [
            (0u32, 0u64),
            (1, 1),
            (7, 2),
            (0xdead_beef, 1000),
            (42, 123_457),
        ] {
            let n = loop_naive(seed, it);
            assert_eq!(loop_matrix(seed, it), n);
            assert_eq!(gf100::compute::loop_result(seed, it), n);
        }
        assert_eq!(
            loop_matrix(5, 1 << 40),
            gf100::compute::loop_result(5, 1 << 40)
        );
    }

    #[test]
    fn small_matrix_products() {
        // [[1,2],[3,4]] * [[5,6],[7,8]] = [[19,22],[43,50]]
        let a = [1, 2, 3, 4];
        let b = [5, 6, 7, 8];
        assert_eq!(mmul_row(&a, &b, 2, 0), [19, 22]);
        assert_eq!(mmul_row(&a, &b, 2, 1), [43, 50]);
        let fa: Vec<u32> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .map(|f| f.to_bits())
            .collect();
        let fb: Vec<u32> = [0.5f32, -1.0, 0.25, 2.0]
            .iter()
            .map(|f| f.to_bits())
            .collect();
        let r: Vec<f32> = fmmul_row(&fa, &fb, 2, 1)
            .into_iter()
            .map(f32::from_bits)
            .collect();
        assert_eq!(r, [3.0 * 0.5 + 4.0 * 0.25, -3.0 + 8.0]);
        assert_eq!(madd(&[u32::MAX, 1], &[1, 1]), [0, 2]);
        let s = fmadd(&[1.5f32.to_bits()], &[2.25f32.to_bits()]);
        assert_eq!(f32::from_bits(s[0]), 3.75);
    }

    #[test]
    fn generators_are_deterministic_and_in_range() {
        assert_eq!(gen_u32(3, 10), gen_u32(3, 10));
        assert_ne!(gen_u32(3, 10), gen_u32(4, 10));
        for b in gen_f32_bits(9, 1000) {
            let f = f32::from_bits(b);
            assert!((-1.0..1.0).contains(&f));
        }
    }

    #[test]
    fn row_sampling() {
        assert_eq!(check_rows(4, 1 << 20), [0, 1, 2, 3]);
        let r = check_rows(1024, 1 << 27);
        assert_eq!(r.len(), 128);
        assert_eq!(r[0], 0);
        assert_eq!(*r.last().unwrap(), 1023);
        assert_eq!(check_rows(1, 0), [0]);
    }
}
