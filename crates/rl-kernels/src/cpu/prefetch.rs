//! A software prefetch: asks the CPU to bring a cache line toward L2 ahead of its use, without
//! waiting for it (a plain load would stall the core for the whole trip to memory). Safe to call
//! with any index: outside the slice it does nothing.
#![allow(unsafe_code)]

/// Prefetches the cache line holding `data[i]` into L2 (and the caches above it) where the
/// instruction exists; a no-op elsewhere and when `i` is outside `data`.
#[inline(always)]
pub(crate) fn to_l2<T>(data: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(v) = data.get(i) {
        // SAFETY: a prefetch never faults and changes no state a program can observe; the
        // address is inside a live slice anyway. SSE is part of the x86_64 baseline.
        unsafe { core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T1 }>((v as *const T).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, i);
}

/// Prefetches every cache line of `data[start..start + len]` into L2 (see [`to_l2`]): a 128-byte
/// row of an AVX-512 panel spans two lines (three when the panel is not line-aligned), and a
/// prefetch fetches only the one line that holds its address.
#[inline(always)]
pub(crate) fn span_to_l2<T>(data: &[T], start: usize, len: usize) {
    let per_line = (64 / std::mem::size_of::<T>().max(1)).max(1);
    let mut i = start;
    while i < start + len {
        to_l2(data, i);
        i += per_line;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetching_past_the_end_of_a_slice_or_from_an_empty_one_does_nothing() {
        let data = vec![1.0f32; 40];
        span_to_l2(&data, 32, 32);
        span_to_l2(&data, 1_000, 64);
        span_to_l2::<f32>(&[], 0, 64);
        span_to_l2(&[(); 4], 0, 4);
        assert_eq!(data.iter().sum::<f32>(), 40.0);
    }
}
