//! Process-wide settings for compute-heavy processes, applied once at the start of `main` while the
//! process still has a single thread (and, in a `cuda` build, two more when the device opens). They
//! are C-level process state that Rust exposes only as `unsafe` calls, so this is one of the few
//! files allowed `unsafe` code (tidy keeps the list).
//!
//! Why they matter (measured with `perf` on the train-step benchmark, 2-core machine):
//! - candle's element-wise thread pool spins 25,000 `pause` instructions after every job before it
//!   parks; on 2 cores those spinning threads take the cores from the GEMM threads (10% of all
//!   samples were the spin loop). The pool reads `CANDLE_BARRIER_POOL_SPIN_LIMIT` once, when it
//!   starts; we set it to 0 unless the user chose a value.
//! - glibc returns freed blocks above its (dynamic) mmap threshold and the top of the heap to the
//!   kernel, so every training step page-faults its activations in again (14% of samples in page
//!   faults). We keep freed memory in the heap instead (memory in use stays what the step needs),
//!   in one arena: with one per thread, glibc unmapped a worker's heaps as they emptied and the
//!   process's peak memory was ~1.5 GB higher at the 0.6B shape. (Binaries whose global
//!   allocator is `alloc.rs`'s, every one in this workspace, take Rust's memory from mimalloc
//!   instead; these settings then cover what C code takes from `malloc`.)
//! - mimalloc purges (decommits) freed pages a second after they were freed, and the next use
//!   faults them in again, zeroed by the kernel: ~1,100 page faults an alphabet-sort SFT step
//!   (300 steps: 480k faults against 138k with purging off, most of those the start), and 2.5-3%
//!   of both the trainer's and the inference server's samples in an RL run went to faults and
//!   `madvise`. We turn purging off (`MIMALLOC_PURGE_DELAY` overrides), as for glibc above: the
//!   pages stay mapped for the next step, and memory in use stays what the busiest step needed.
//!   What loading a model freed is purged once, by `alloc::release_kept_blocks` (it would never
//!   be needed again, and stayed resident: `rl inference` at the 0.6B shape held 8.2 GB for 1.1 GB
//!   of packed weights).
#![allow(unsafe_code)]

/// candle's spin limit for its element-wise thread pool, unless already set.
const SPIN_LIMIT_VAR: &str = "CANDLE_BARRIER_POOL_SPIN_LIMIT";

/// mimalloc's own variable for its purge delay (milliseconds; -1 never purges).
const PURGE_DELAY_VAR: &str = "MIMALLOC_PURGE_DELAY";

/// `mi_option_purge_delay`'s place in mimalloc's `mi_option_t` enum (v2 and v3 alike; the sys
/// crate names no constant for it). A unit test checks a neighbour's default to catch a shift.
pub(crate) const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// What [`tune_process`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// The spin limit was set (false: the user's own value was kept, or threads already ran).
    pub spin_limit_set: bool,
    /// The allocator keeps freed memory (false on non-glibc targets, or if glibc refused).
    pub allocator_tuned: bool,
    /// mimalloc's purging of freed pages was turned off (false: the user set its delay).
    pub purging_off: bool,
}

/// Applies the settings above. Call first thing in `main`, before any thread is started: the
/// environment is changed only while this process provably has one thread (checked in
/// `/proc/self/status`), and is left alone otherwise.
pub fn tune_process() -> Tuning {
    let spin_limit_set = std::env::var_os(SPIN_LIMIT_VAR).is_none() && single_threaded() && {
        // SAFETY: `set_var` is unsound only while another thread may read or write the
        // environment; `single_threaded` just confirmed this process has exactly one thread.
        unsafe { std::env::set_var(SPIN_LIMIT_VAR, "0") };
        true
    };
    Tuning { spin_limit_set, allocator_tuned: keep_freed_memory(), purging_off: keep_mimalloc_pages() }
}

/// Turns mimalloc's purging of freed pages off unless `MIMALLOC_PURGE_DELAY` is set.
fn keep_mimalloc_pages() -> bool {
    if std::env::var_os(PURGE_DELAY_VAR).is_some() {
        return false;
    }
    // SAFETY: `mi_option_set` stores one option value (mimalloc reads options atomically, on any
    // thread, at any time); -1 is the purge delay's documented "no purging".
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    true
}

/// Whether the process has exactly one thread (Linux: `/proc/self/status`; elsewhere unknown,
/// so false).
fn single_threaded() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Threads:").map(|n| n.trim().parse::<u32>().ok())))
        .flatten()
        == Some(1)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() -> bool {
    // glibc caps the mmap threshold at 32 MiB on 64-bit targets; blocks above it still come from
    // mmap. Trimming starts only beyond 1 GiB of free heap top. One arena for every thread.
    const MMAP_THRESHOLD: libc::c_int = 32 << 20;
    const TRIM_THRESHOLD: libc::c_int = 1 << 30;
    const TOP_PAD: libc::c_int = 16 << 20;
    // SAFETY: `mallopt` only changes allocator parameters (thread-safe in glibc) and is given
    // documented parameters with in-range values; it returns 0 when it refuses one.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
            && libc::mallopt(libc::M_TOP_PAD, TOP_PAD) == 1
            && libc::mallopt(libc::M_ARENA_MAX, 1) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() -> bool {
    false
}

/// Set to `1` to keep cudarc's per-tensor CUDA events (see [`single_stream_cuda`]).
#[cfg(feature = "cuda")]
pub const CUDA_EVENT_TRACKING_VAR: &str = "RL_CUDA_EVENT_TRACKING";

/// Turns off cudarc's per-tensor event tracking on a freshly opened device, unless
/// `RL_CUDA_EVENT_TRACKING=1`; returns whether it did. candle runs every kernel, copy and free of
/// a device on the one stream it makes for it, but making that stream puts cudarc in multi-stream
/// mode, where each tensor allocated gets two CUDA events and every kernel argument records or
/// waits on one: host work per launch that one stream's FIFO order makes unnecessary. Call right
/// after opening the device (tensors made before keep their events). Not yet measured on a GPU
/// (`docs/gpu.md`).
#[cfg(feature = "cuda")]
pub fn single_stream_cuda(device: &candle_core::CudaDevice) -> bool {
    if std::env::var(CUDA_EVENT_TRACKING_VAR).as_deref() == Ok("1") {
        return false;
    }
    // SAFETY: cudarc asks that a caller without events order the streams that share a tensor;
    // here only the device's own stream ever touches its tensors (candle launches, copies and
    // frees on it, and our kernels launch through candle's device), so its order is the order of
    // every use.
    unsafe { device.disable_event_tracking() };
    true
}

/// Set to `1` to let the CUDA memory pool hand freed memory back at each synchronisation (see
/// [`keep_cuda_pool_memory`]).
#[cfg(feature = "cuda")]
pub const CUDA_POOL_RELEASE_VAR: &str = "RL_CUDA_POOL_RELEASE";

/// Keeps freed device memory in the device's default memory pool, unless
/// `RL_CUDA_POOL_RELEASE=1`; returns whether it did. candle allocates every op's output with
/// `cuMemAllocAsync` from that pool, whose release threshold is 0 by default: at each
/// synchronisation (every copy of a loss or logprobs to the host) it returns its free memory to
/// the driver, and the next step maps it again. PyTorch's caching allocator keeps it; so does a
/// threshold of `u64::MAX`. Not yet measured on a GPU (`docs/gpu.md`).
#[cfg(feature = "cuda")]
pub fn keep_cuda_pool_memory(device: &candle_core::CudaDevice) -> bool {
    use candle_core::cuda_backend::cudarc::driver::sys;
    if std::env::var(CUDA_POOL_RELEASE_VAR).as_deref() == Ok("1") {
        return false;
    }
    let stream = device.cuda_stream();
    let context = stream.context();
    if !context.has_async_alloc() {
        return false;
    }
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer and the device handle comes from a live context.
    let got = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, context.cu_device()) };
    if got != sys::CUresult::CUDA_SUCCESS || pool.is_null() {
        return false;
    }
    let mut threshold = u64::MAX;
    // SAFETY: the release threshold attribute takes a pointer to a `cuuint64_t`, valid for the call.
    let set = unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&raw mut threshold).cast(),
        )
    };
    set == sys::CUresult::CUDA_SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allocator_accepts_the_settings_and_threads_are_counted() {
        let t = tune_process();
        // Set only when the process had one thread (the test harness may run tests on others).
        assert!(!t.spin_limit_set || std::env::var(SPIN_LIMIT_VAR).as_deref() == Ok("0"));
        // With a second thread alive, the environment is never touched.
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let helper = std::thread::spawn(move || wait.recv());
        assert!(!single_threaded());
        release.send(()).expect("helper alive");
        let _ = helper.join();
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        assert!(t.allocator_tuned);
        // The option set is the purge delay: `os_tag`, three places after it, has its default.
        // SAFETY: `mi_option_get` reads an option value.
        let (os_tag, purge) = unsafe {
            (
                libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY + 3),
                libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY),
            )
        };
        assert_eq!(os_tag, 100, "mimalloc's option enum moved: check MI_OPTION_PURGE_DELAY");
        if t.purging_off {
            assert_eq!(purge, -1);
        }
        // Memory still works: a large block (heap, not mmap) round-trips.
        let v = vec![1.0f32; 4 << 20];
        assert_eq!(v.iter().sum::<f32>(), (4 << 20) as f32);
    }
}
