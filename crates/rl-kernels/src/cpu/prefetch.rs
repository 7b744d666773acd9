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
