//! Strided matrix views over slices and the one safe entry to the `gemm` crate (the same kernel
//! candle's CPU matmul uses). This file is the workspace's only `unsafe` code: every call checks
//! that each view stays inside its slice, and the borrow checker keeps `dst` apart from the inputs.
#![allow(unsafe_code)]

use crate::float::Real;

/// A read-only `rows x cols` matrix inside a slice: element (r, c) is `data[r * rs + c * cs]`.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

/// A writable `rows x cols` matrix inside a slice; rows or columns must be unit-stride and the
/// other stride at least as long as them, so no two elements share a place.
#[derive(Debug)]
pub struct MatMut<'a, T> {
    data: &'a mut [T],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

/// Index one past the last element a `rows x cols` view with strides `rs`, `cs` touches.
fn extent(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 { 0 } else { (rows - 1) * rs + (cols - 1) * cs + 1 }
}

impl<'a, T> MatRef<'a, T> {
    /// A view; panics if it would reach outside `data` (a bug in the caller, never input-driven).
    pub fn new(data: &'a [T], rows: usize, cols: usize, rs: usize, cs: usize) -> Self {
        assert!(
            extent(rows, cols, rs, cs) <= data.len(),
            "matrix view {rows}x{cols} (rs {rs}, cs {cs}) exceeds {}",
            data.len()
        );
        MatRef { data, rows, cols, rs, cs }
    }

    /// A row-major view with leading dimension `ld` starting at `data[0]`.
    pub fn rows(data: &'a [T], rows: usize, cols: usize, ld: usize) -> Self {
        Self::new(data, rows, cols, ld, 1)
    }

    /// The transpose (no copy).
    pub fn t(self) -> Self {
        MatRef { data: self.data, rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs }
    }

    /// Rows `start..start + n`.
    pub fn row_range(self, start: usize, n: usize) -> Self {
        assert!(start + n <= self.rows, "rows {start}..{} of {}", start + n, self.rows);
        if n == 0 {
            return MatRef { data: &self.data[..0], rows: 0, ..self };
        }
        MatRef { data: &self.data[start * self.rs..], rows: n, ..self }
    }

    /// Columns `start..start + n`.
    pub fn col_range(self, start: usize, n: usize) -> Self {
        assert!(start + n <= self.cols, "columns {start}..{} of {}", start + n, self.cols);
        if n == 0 {
            return MatRef { data: &self.data[..0], cols: 0, ..self };
        }
        MatRef { data: &self.data[start * self.cs..], cols: n, ..self }
    }

    /// Number of rows.
    pub fn nrows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn ncols(&self) -> usize {
        self.cols
    }
}

impl<'a, T> MatMut<'a, T> {
    /// A writable view; panics if it would reach outside `data` or alias itself.
    pub fn new(data: &'a mut [T], rows: usize, cols: usize, rs: usize, cs: usize) -> Self {
        assert!(
            extent(rows, cols, rs, cs) <= data.len(),
            "matrix view {rows}x{cols} (rs {rs}, cs {cs}) exceeds {}",
            data.len()
        );
        let distinct =
            rows <= 1 && cols <= 1 || (cs == 1 && (rows <= 1 || rs >= cols)) || (rs == 1 && (cols <= 1 || cs >= rows));
        assert!(distinct, "writable view {rows}x{cols} (rs {rs}, cs {cs}) would alias itself");
        MatMut { data, rows, cols, rs, cs }
    }

    /// A row-major view with leading dimension `ld`.
    pub fn rows(data: &'a mut [T], rows: usize, cols: usize, ld: usize) -> Self {
        Self::new(data, rows, cols, ld, 1)
    }

    /// The same view, borrowed for a shorter time (to write it more than once).
    pub fn reborrow(&mut self) -> MatMut<'_, T> {
        MatMut { data: self.data, rows: self.rows, cols: self.cols, rs: self.rs, cs: self.cs }
    }
}

/// `dst = scale * lhs * rhs` (or `dst += scale * lhs * rhs` when `accumulate`), single-threaded:
/// callers parallelise over independent blocks.
pub fn matmul<T: Real>(dst: MatMut<'_, T>, lhs: MatRef<'_, T>, rhs: MatRef<'_, T>, scale: T, accumulate: bool) {
    product(dst, lhs, rhs, scale, accumulate, gemm::Parallelism::None);
}

/// Products smaller than this many multiply-adds run on one thread.
const PARALLEL_MIN_MACS: usize = 1 << 17;

/// Rows per thread when a product of `m` rows is split across `threads` (a multiple of 64, the
/// AVX-512 micro-kernel's height); `None` when it is not worth splitting.
fn row_split(m: usize, k: usize, n: usize, threads: usize) -> Option<usize> {
    if threads < 2 || m < 128 || m * k * n < PARALLEL_MIN_MACS {
        return None;
    }
    Some(m.div_ceil(threads).next_multiple_of(64))
}

/// Columns per block when a product of `n` columns is split across `threads`: each thread then
/// packs only its own columns of `rhs`, where row blocks each pack all of it (at a 512 x 1024 x
/// 3072 product on two threads, 262 GFLOP/s against 179). Only when `rhs` is the larger operand
/// (`n > m`: row blocks share the packing of the smaller one) and too large for the caches
/// (a million elements: the 0.6B shape's weights, not the `small` preset's 256 x 1536).
fn col_split(m: usize, k: usize, n: usize, threads: usize) -> Option<usize> {
    if threads < 2 || n < 1024 || n <= m || k * n < 1 << 20 || m * k * n < PARALLEL_MIN_MACS {
        return None;
    }
    Some(n.div_ceil(threads).next_multiple_of(16))
}

/// A pointer that column blocks running on pool threads share (each writes only its own columns).
#[derive(Clone, Copy)]
struct SharedDst<T>(*mut T);
// SAFETY: the blocks built from it address disjoint elements (see `by_columns`).
unsafe impl<T: Send> Send for SharedDst<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedDst<T> {}

impl<T> SharedDst<T> {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper, not its field).
    fn get(&self) -> *mut T {
        self.0
    }
}

/// `dst = scale * lhs * rhs` (or `+=`) with `dst` at `ptr` (strides `rs`, `cs`, `m x n`), in
/// column blocks of `per` on the current pool's threads.
///
/// # Safety
/// `ptr` must address an exclusively borrowed `m x n` matrix with strides `rs`, `cs` that maps
/// distinct (r, c) to distinct places (initialised unless `accumulate` is false).
#[allow(clippy::too_many_arguments)]
unsafe fn by_columns<T: Real>(
    ptr: *mut T,
    (m, n, rs, cs): (usize, usize, usize, usize),
    lhs: MatRef<'_, T>,
    rhs: MatRef<'_, T>,
    scale: T,
    accumulate: bool,
    per: usize,
) {
    use rayon::prelude::*;
    let dst = SharedDst(ptr);
    (0..n.div_ceil(per)).into_par_iter().for_each(|b| {
        let (c0, nb) = (b * per, per.min(n - b * per));
        // SAFETY: block `b` writes columns c0..c0 + nb only, inside the matrix the caller vouches
        // for; blocks are disjoint, so no element is written by two threads.
        unsafe { raw_product(dst.get().add(c0 * cs), (m, nb, rs, cs), lhs, rhs.col_range(c0, nb), scale, accumulate) };
    });
}

/// [`matmul`] on every thread of the current rayon pool (for one large product): column blocks of
/// a wide product, else row blocks of `dst`, run as independent single-threaded products. The
/// `gemm` crate's own parallel mode runs the training step's shapes (a few hundred rows) at
/// single-thread speed.
pub fn matmul_par<T: Real>(dst: MatMut<'_, T>, lhs: MatRef<'_, T>, rhs: MatRef<'_, T>, scale: T, accumulate: bool) {
    let threads = rayon::current_num_threads();
    let (m, k, n) = (dst.rows, lhs.cols, dst.cols);
    if let Some(per) = col_split(m, k, n, threads)
        && k > 0
        && lhs.rows == m
        && rhs.rows == k
        && rhs.cols == n
    {
        let MatMut { data, rows, cols, rs, cs } = dst;
        // SAFETY: `dst` is borrowed exclusively and its constructor checked its extent and that
        // distinct (r, c) map to distinct places.
        unsafe { by_columns(data.as_mut_ptr(), (rows, cols, rs, cs), lhs, rhs, scale, accumulate, per) };
        return;
    }
    match row_split(m, k, n, threads) {
        // Row blocks of a row-major destination are disjoint slices.
        Some(per) if dst.cs == 1 && dst.rows > per => {
            let MatMut { data, rows, cols, rs, cs } = dst;
            let (top, bottom) = data.split_at_mut((per * rs).min(data.len()));
            let upper = MatMut { data: top, rows: per, cols, rs, cs };
            let lower = MatMut { data: bottom, rows: rows - per, cols, rs, cs };
            rayon::join(
                || product(upper, lhs.row_range(0, per), rhs, scale, accumulate, gemm::Parallelism::None),
                || matmul_par(lower, lhs.row_range(per, rows - per), rhs, scale, accumulate),
            );
        }
        // Too few rows to split (or the last block): the gemm crate's own parallel mode for
        // large products.
        _ => {
            let large = threads > 1 && m * k * n >= PARALLEL_MIN_MACS;
            let par = if large { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
            product(dst, lhs, rhs, scale, accumulate, par);
        }
    }
}

/// `scale * lhs * rhs` as a new row-major buffer, on every thread of the current rayon pool when
/// `parallel` (row blocks as in [`matmul_par`]). The product writes every element, so the buffer
/// is never zero-filled first (a full extra pass over memory for the large activations of a
/// training step).
pub fn product_new<T: Real>(lhs: MatRef<'_, T>, rhs: MatRef<'_, T>, scale: T, parallel: bool) -> Vec<T> {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert_eq!(rhs.rows, k, "matmul shapes {m}x{k} * {}x{n}", rhs.rows);
    if m == 0 || n == 0 || k == 0 {
        return vec![T::ZERO; m * n];
    }
    let threads = if parallel { rayon::current_num_threads() } else { 1 };
    if let Some(per) = col_split(m, k, n, threads) {
        let mut out: Vec<T> = Vec::with_capacity(m * n);
        // SAFETY: the spare capacity holds m * n elements, addressed row-major; with
        // `accumulate = false` gemm never reads the destination, and the column blocks together
        // write each of the m * n elements once (k > 0), so all are initialised before `set_len`.
        unsafe {
            by_columns(out.as_mut_ptr(), (m, n, n, 1), lhs, rhs, scale, false, per);
            out.set_len(m * n);
        }
        return out;
    }
    let per = row_split(m, k, n, threads).unwrap_or(m);
    let mut out: Vec<T> = Vec::with_capacity(m * n);
    let blocks: Vec<(usize, &mut [std::mem::MaybeUninit<T>])> =
        out.spare_capacity_mut()[..m * n].chunks_mut(per * n).enumerate().collect();
    let write = |(b, block): (usize, &mut [std::mem::MaybeUninit<T>])| {
        let rows = block.len() / n;
        uninit_product(block, lhs.row_range(b * per, rows), rhs, scale);
    };
    if blocks.len() > 1 {
        use rayon::prelude::*;
        blocks.into_par_iter().for_each(write);
    } else {
        blocks.into_iter().for_each(write);
    }
    // SAFETY: the blocks cover the first m * n elements of `out`'s spare capacity, and
    // `uninit_product` initialised every element of each block.
    unsafe { out.set_len(m * n) };
    out
}

/// `dst = scale * lhs * rhs` into uninitialised row-major memory (`lhs.rows` rows of `rhs.cols`),
/// single-threaded; initialises every element.
fn uninit_product<T: Real>(dst: &mut [std::mem::MaybeUninit<T>], lhs: MatRef<'_, T>, rhs: MatRef<'_, T>, scale: T) {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert!(dst.len() == m * n && rhs.rows == k && k > 0, "uninit product {m}x{k} * {}x{n}", rhs.rows);
    let stride = |s: usize| isize::try_from(s).expect("stride fits isize");
    // SAFETY: `dst` holds exactly m * n elements, addressed row-major (row stride n, column stride
    // 1); with `read_dst = false` gemm sets its alpha to 0, never reads the destination and writes
    // each of the m * n elements (k > 0). The input views were bounds-checked at construction.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr().cast::<T>(),
            1,
            stride(n),
            false,
            lhs.data.as_ptr(),
            stride(lhs.cs),
            stride(lhs.rs),
            rhs.data.as_ptr(),
            stride(rhs.cs),
            stride(rhs.rs),
            T::ONE,
            scale,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

fn product<T: Real>(
    dst: MatMut<'_, T>,
    lhs: MatRef<'_, T>,
    rhs: MatRef<'_, T>,
    scale: T,
    accumulate: bool,
    par: gemm::Parallelism,
) {
    let MatMut { data, rows: m, cols: n, rs, cs } = dst;
    let k = lhs.cols;
    assert!(
        lhs.rows == m && rhs.rows == k && rhs.cols == n,
        "matmul shapes {}x{} * {}x{} -> {m}x{n}",
        lhs.rows,
        k,
        rhs.rows,
        rhs.cols
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                for c in 0..n {
                    data[r * rs + c * cs] = T::ZERO;
                }
            }
        }
        return;
    }
    // SAFETY: the constructors checked that every (r, c) of each view maps inside its slice, and
    // that `dst` maps distinct (r, c) to distinct places; `dst` is borrowed mutably, so it cannot
    // overlap `lhs` or `rhs`.
    unsafe { raw_product_with(data.as_mut_ptr(), (m, n, rs, cs), lhs, rhs, scale, accumulate, par) };
}

/// [`product`] into a raw destination, single-threaded.
///
/// # Safety
/// As [`by_columns`]; `k > 0` and the shapes agree.
unsafe fn raw_product<T: Real>(
    ptr: *mut T,
    dims: (usize, usize, usize, usize),
    lhs: MatRef<'_, T>,
    rhs: MatRef<'_, T>,
    scale: T,
    accumulate: bool,
) {
    // SAFETY: forwarded from the caller.
    unsafe { raw_product_with(ptr, dims, lhs, rhs, scale, accumulate, gemm::Parallelism::None) }
}

/// # Safety
/// `ptr` addresses an exclusively borrowed `m x n` matrix with strides `rs`, `cs` mapping distinct
/// (r, c) to distinct places, not overlapping `lhs` or `rhs` (initialised when `accumulate`).
unsafe fn raw_product_with<T: Real>(
    ptr: *mut T,
    (m, n, rs, cs): (usize, usize, usize, usize),
    lhs: MatRef<'_, T>,
    rhs: MatRef<'_, T>,
    scale: T,
    accumulate: bool,
    par: gemm::Parallelism,
) {
    let k = lhs.cols;
    assert!(lhs.rows == m && rhs.rows == k && rhs.cols == n && k > 0, "matmul shapes");
    let stride = |s: usize| isize::try_from(s).expect("stride fits isize");
    // SAFETY: the views were bounds-checked at construction and the caller vouches for `ptr`;
    // `gemm` reads and writes exactly those elements (with `read_dst = false` it never reads the
    // destination).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            ptr,
            stride(cs),
            stride(rs),
            accumulate,
            lhs.data.as_ptr(),
            stride(lhs.cs),
            stride(lhs.rs),
            rhs.data.as_ptr(),
            stride(rhs.cs),
            stride(rhs.rs),
            T::ONE,
            scale,
            false,
            false,
            false,
            par,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    #[test]
    fn strided_products_match_the_definition() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f64> = (0..m * k).map(|i| (i as f64 * 0.37).sin()).collect();
        let b: Vec<f64> = (0..k * n).map(|i| (i as f64 * 0.11).cos()).collect();
        let want = naive(&a, &b, m, k, n);
        let mut c = vec![1.0; m * n];
        matmul(MatMut::rows(&mut c, m, n, n), MatRef::rows(&a, m, k, k), MatRef::rows(&b, k, n, n), 2.0, false);
        for (x, y) in c.iter().zip(&want) {
            assert!((x - 2.0 * y).abs() < 1e-12);
        }
        // B stored transposed (n x k), read through a transposed view; accumulate onto c.
        let bt: Vec<f64> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        matmul(MatMut::rows(&mut c, m, n, n), MatRef::rows(&a, m, k, k), MatRef::rows(&bt, n, k, k).t(), 1.0, true);
        for (x, y) in c.iter().zip(&want) {
            assert!((x - 3.0 * y).abs() < 1e-12);
        }
    }

    #[test]
    fn new_products_write_every_element() {
        for (m, k, n, par) in [(5, 7, 3, false), (64, 33, 97, true), (3, 0, 4, false), (0, 3, 2, true)] {
            let a: Vec<f64> = (0..m * k).map(|i| (i as f64 * 0.37).sin()).collect();
            let b: Vec<f64> = (0..k * n).map(|i| (i as f64 * 0.11).cos()).collect();
            let want = naive(&a, &b, m, k, n);
            let got = product_new(MatRef::rows(&a, m, k, k), MatRef::rows(&b, k, n, n), 0.5, par);
            assert_eq!(got.len(), m * n);
            for (x, y) in got.iter().zip(&want) {
                assert!((x - 0.5 * y).abs() < 1e-12, "{m}x{k}x{n}: {x} vs {}", 0.5 * y);
            }
        }
    }

    /// Wide products split by columns across a pool equal the definition (new and accumulated,
    /// through a transposed view and into a strided destination).
    #[test]
    fn wide_products_split_by_columns_match_the_definition() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let (m, k, n) = (70, 520, 2100);
        let a: Vec<f64> = (0..m * k).map(|i| (i as f64 * 0.37).sin()).collect();
        let bt: Vec<f64> = (0..n * k).map(|i| (i as f64 * 0.11).cos()).collect();
        let b: Vec<f64> = (0..k * n).map(|i| bt[(i % n) * k + i / n]).collect();
        let want = naive(&a, &b, m, k, n);
        pool.install(|| {
            assert!(col_split(m, k, n, rayon::current_num_threads()).is_some());
            let got = product_new(MatRef::rows(&a, m, k, k), MatRef::rows(&bt, n, k, k).t(), 0.5, true);
            for (x, y) in got.iter().zip(&want) {
                assert!((x - 0.5 * y).abs() < 1e-12);
            }
            let ld = n + 3;
            let mut c = vec![1.0; m * ld];
            matmul_par(MatMut::rows(&mut c, m, n, ld), MatRef::rows(&a, m, k, k), MatRef::rows(&b, k, n, n), 2.0, true);
            for r in 0..m {
                for j in 0..n {
                    assert!((c[r * ld + j] - 1.0 - 2.0 * want[r * n + j]).abs() < 1e-12);
                }
                assert_eq!(&c[r * ld + n..r * ld + ld], &[1.0; 3], "the gap between rows is untouched");
            }
        });
    }

    #[test]
    fn views_past_the_slice_or_aliasing_themselves_are_refused() {
        let data = [0.0f32; 10];
        assert!(std::panic::catch_unwind(|| MatRef::rows(&data, 3, 4, 4)).is_err());
        assert!(std::panic::catch_unwind(|| MatRef::rows(&data, 2, 4, 4)).is_ok());
        let overlapping = std::panic::catch_unwind(|| {
            let mut d = [0.0f32; 10];
            let _ = MatMut::new(&mut d, 3, 3, 2, 1);
        });
        assert!(overlapping.is_err());
    }
}
