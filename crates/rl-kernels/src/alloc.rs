//! The global allocator: mimalloc, with freed blocks of 1 MiB or more kept for the next request of
//! about their size instead of being handed back.
//!
//! Why mimalloc under it: glibc's `malloc`, in the one arena `process.rs` configures, spent ~40%
//! of the SFT start (tokenizing 64,000 conversations: millions of small blocks) sorting and
//! coalescing its free lists (`_int_malloc`, `unlink_chunk`, `malloc_consolidate`), and 13-17% of
//! a tiny-model train step (perf, 2-core machine). With mimalloc the alphabet-sort SFT starts in
//! ~11 s instead of ~24 s and an RL step of the 15-minute recipe is ~5% shorter (same run).
//! mimalloc is built without its transparent-huge-page advice (`no_thp`): with it, the 0.6B
//! step's peak memory was 515 MB higher (14,092 against 13,577 MB) for no speed.
//!
//! Why the kept blocks: an allocator hands large freed blocks back to the kernel (glibc
//! `munmap`s blocks of 32 MiB or more at once; mimalloc purges freed memory after a short delay).
//! A training step at a real model size (the 0.6B shape: logits of 384 x 151,936, the output
//! head's 622 MB weight gradient, a 63 MB gradient per layer, megabytes of activations per layer,
//! the GEMM's packing buffers) then page-faulted ~9 GB of fresh, kernel-zeroed pages every step
//! (measured on glibc), and every `munmap` interrupted the other core to flush its TLB: ~40% of
//! the step in the kernel (perf, 2-core machine); with the blocks kept, ~30 faults a step. The
//! kept blocks are bounded by a byte budget (a third of the machine's memory, or
//! `RL_ALLOC_CACHE_MB`; the oldest go first) and by age (a block not reused within 5 minutes is
//! released at the next free), and all of them go when the process says its loading is done
//! ([`release_kept_blocks`]: a model load's buffers, the file's bytes and each tensor's conversions,
//! are never asked for again, and would otherwise stay counted in the process's memory for
//! minutes). Every block stays a genuine mimalloc block, so `mi_free`,
//! `mi_realloc_aligned` and `mi_usable_size` stay valid on it. Binaries opt in with
//! `#[global_allocator]`; `GlobalAlloc` is an `unsafe` trait, so this file is one of the few that
//! hold `unsafe` code.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};

use mimalloc::MiMalloc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// Blocks at least this large are kept on free.
pub const LARGE_BLOCK: usize = 1 << 20;

/// Largest alignment served from kept blocks (a kept block serves a request only when its
/// address has the alignment asked for).
const MAX_ALIGN: usize = 4096;

/// At most this many blocks are kept.
const SLOTS: usize = 512;

/// The default budget is this fraction of the machine's memory (`RL_ALLOC_CACHE_MB` sets it;
/// 0 keeps nothing). A step that frees more than the budget before it allocates again evicts
/// blocks it would have reused: the 0.6B full step churns ~5 GB.
const BUDGET_DIVISOR: usize = 3;

/// Used when the machine's memory is unknown.
const FALLBACK_BUDGET: usize = 4 << 30;

/// A block kept this long without being reused is released.
const MAX_AGE_S: u64 = 300;

/// A kept block serves requests down to this fraction of its size (so a block is not spent on
/// a much smaller request while it fits a later one exactly).
const MIN_FILL_EIGHTHS: usize = 7;

/// How many times [`release_kept_blocks`] was called: a cache that has seen fewer releases its
/// blocks at its next free, and serves none until then.
static RELEASES: AtomicU64 = AtomicU64::new(0);

/// Hands every kept block of the process's [`LargeBlockCache`] back to the system: for after a
/// phase whose large buffers will not be asked for again (loading a model), once they are freed.
/// (A cache acts at its next free of a large block; this frees one, so the global allocator acts
/// now, with mimalloc's purging on for the moment: `tune_process` turns it off, and memory
/// mimalloc frees unpurged stays resident.)
pub fn release_kept_blocks() {
    use crate::process::MI_OPTION_PURGE_DELAY;
    // One release at a time: two would each put back the other's 0 as the purge delay.
    static RELEASING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = RELEASING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // SAFETY: `mi_option_get` / `mi_option_set` read and store one option value (atomically, on
    // any thread); 0 purges at once, and the value `tune_process` set is put back after.
    let delay = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
    RELEASES.fetch_add(1, Ordering::Relaxed);
    drop(std::hint::black_box(Vec::<u8>::with_capacity(LARGE_BLOCK)));
    // SAFETY: `mi_collect` frees and purges what this thread's heap holds unused.
    unsafe { libmimalloc_sys::mi_collect(true) };
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, delay) };
}

/// A freed large block: its address and usable size (`mi_usable_size`, at least what was asked).
#[derive(Clone, Copy)]
struct Kept {
    ptr: usize,
    size: usize,
    /// When it was kept (a counter): the oldest goes first when the budget is reached.
    age: u64,
    /// When it was kept, in seconds of [`clock`].
    at_s: u64,
}

/// Seconds since the first call (monotonic; `Instant` does not allocate).
fn clock() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs()
}

/// The machine's physical memory in bytes, if known.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn physical_memory() -> Option<usize> {
    // SAFETY: `sysconf` reads a system constant; it returns -1 when unknown.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    (pages > 0 && page > 0).then(|| (pages as usize).saturating_mul(page as usize))
}

/// The global allocator: [`MiMalloc`] for everything, with freed blocks of [`LARGE_BLOCK`]
/// or more kept for reuse (see the file's documentation for the bounds).
#[allow(missing_debug_implementations)]
pub struct LargeBlockCache {
    lock: AtomicBool,
    /// Guarded by `lock`.
    kept: std::cell::UnsafeCell<[Option<Kept>; SLOTS]>,
    /// Guarded by `lock`: bytes in `kept`, and the next age.
    bytes: std::cell::UnsafeCell<(usize, u64)>,
    /// The budget in bytes, read from the environment on first use (`usize::MAX`: not yet read).
    budget: AtomicUsize,
    /// Requests served from kept blocks (a statistic for tests and benchmarks).
    hits: AtomicUsize,
    /// The [`RELEASES`] this cache has acted on.
    released: AtomicU64,
}

// SAFETY: the cells are only touched while `lock` is held (see `with_lock`).
unsafe impl Sync for LargeBlockCache {}

impl Default for LargeBlockCache {
    fn default() -> Self {
        Self::new()
    }
}

impl LargeBlockCache {
    /// An empty cache (a `const fn`: a `#[global_allocator]` static).
    pub const fn new() -> Self {
        LargeBlockCache {
            lock: AtomicBool::new(false),
            kept: std::cell::UnsafeCell::new([None; SLOTS]),
            bytes: std::cell::UnsafeCell::new((0, 0)),
            budget: AtomicUsize::new(usize::MAX),
            hits: AtomicUsize::new(0),
            released: AtomicU64::new(0),
        }
    }

    /// Requests served from kept blocks so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::Relaxed)
    }

    /// Bytes kept now.
    pub fn kept_bytes(&self) -> usize {
        self.with_lock(|_, bytes| bytes.0)
    }

    fn budget(&self) -> usize {
        let b = self.budget.load(Ordering::Relaxed);
        if b != usize::MAX {
            return b;
        }
        // Reading the environment allocates below the large-block size, which never re-enters
        // this path.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        let default = physical_memory().map_or(FALLBACK_BUDGET, |m| m / BUDGET_DIVISOR);
        #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
        let default = FALLBACK_BUDGET;
        let b = std::env::var("RL_ALLOC_CACHE_MB")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .map_or(default, |mb| mb.saturating_mul(1 << 20));
        self.budget.store(b, Ordering::Relaxed);
        b
    }

    fn with_lock<R>(&self, f: impl FnOnce(&mut [Option<Kept>; SLOTS], &mut (usize, u64)) -> R) -> R {
        while self.lock.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::hint::spin_loop();
        }
        // SAFETY: the lock is held, so no other thread touches the cells until it is released.
        let r = unsafe { f(&mut *self.kept.get(), &mut *self.bytes.get()) };
        self.lock.store(false, Ordering::Release);
        r
    }

    /// A kept block that fits `size` (the smallest such; of equal ones the most recently
    /// freed, whose pages are likeliest still in the caches), taken out of the cache.
    fn take(&self, size: usize, align: usize) -> Option<*mut u8> {
        self.take_after(size, align, RELEASES.load(Ordering::Relaxed))
    }

    /// [`LargeBlockCache::take`] when [`release_kept_blocks`] has been called `releases` times.
    fn take_after(&self, size: usize, align: usize, releases: u64) -> Option<*mut u8> {
        if self.released.load(Ordering::Relaxed) != releases {
            // Released at the next free, not reused meanwhile.
            return None;
        }
        let found = self.with_lock(|kept, bytes| {
            let best = (0..SLOTS)
                .filter_map(|i| kept[i].map(|k| (i, k)))
                .filter(|(_, k)| k.size >= size && size * 8 >= k.size * MIN_FILL_EIGHTHS && k.ptr % align == 0)
                .min_by_key(|(_, k)| (k.size, std::cmp::Reverse(k.age)))?;
            kept[best.0] = None;
            bytes.0 -= best.1.size;
            Some(best.1.ptr as *mut u8)
        });
        if found.is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Keeps `ptr` (usable size `size`) unless it exceeds the budget; returns the blocks to free:
    /// those kept longer than [`MAX_AGE_S`], the oldest ones evicted to make room, or `ptr`
    /// itself.
    fn keep(&self, ptr: *mut u8, size: usize) -> [Option<usize>; SLOTS + 1] {
        self.keep_at(ptr, size, clock(), RELEASES.load(Ordering::Relaxed))
    }

    /// [`LargeBlockCache::keep`] at time `now` (seconds of [`clock`]), when
    /// [`release_kept_blocks`] has been called `releases` times.
    fn keep_at(&self, ptr: *mut u8, size: usize, now: u64, releases: u64) -> [Option<usize>; SLOTS + 1] {
        let budget = self.budget();
        let mut evicted = [None; SLOTS + 1];
        if size > budget {
            evicted[0] = Some(ptr as usize);
            return evicted;
        }
        let release_all = self.released.swap(releases, Ordering::Relaxed) != releases;
        self.with_lock(|kept, bytes| {
            let mut n = 0;
            let mut evict = |slot: &mut Option<Kept>, bytes: &mut (usize, u64)| {
                let k = slot.take().expect("an occupied slot");
                bytes.0 -= k.size;
                evicted[n] = Some(k.ptr);
                n += 1;
            };
            for slot in kept.iter_mut() {
                if slot.is_some_and(|k| release_all || now.saturating_sub(k.at_s) > MAX_AGE_S) {
                    evict(slot, bytes);
                }
            }
            // Then the oldest, until the new one fits the budget and a slot.
            while bytes.0 + size > budget || kept.iter().all(Option::is_some) {
                let Some(oldest) = (0..SLOTS).filter(|&i| kept[i].is_some()).min_by_key(|&i| kept[i].map(|k| k.age))
                else {
                    break;
                };
                evict(&mut kept[oldest], bytes);
            }
            let slot = kept.iter().position(Option::is_none).expect("eviction freed a slot");
            kept[slot] = Some(Kept { ptr: ptr as usize, size, age: bytes.1, at_s: now });
            bytes.0 += size;
            bytes.1 += 1;
        });
        evicted
    }

    /// Whether a layout goes through the cache: large, with at most a page's alignment (every
    /// block is a mimalloc block either way, which `mi_free` releases whatever its alignment).
    fn cached(layout: Layout) -> bool {
        layout.size() >= LARGE_BLOCK && layout.align() <= MAX_ALIGN
    }
}

impl Drop for LargeBlockCache {
    /// Frees the kept blocks (a `#[global_allocator]` static is never dropped; a cache made in a
    /// test is).
    fn drop(&mut self) {
        for k in self.kept.get_mut().iter_mut().filter_map(Option::take) {
            // SAFETY: a kept mimalloc block no one else holds; `mi_free` ignores the layout.
            unsafe { MiMalloc.dealloc(k.ptr as *mut u8, Layout::from_size_align(k.size, 16).expect("a kept size")) };
        }
    }
}

fn usable_size(ptr: *mut u8) -> usize {
    // SAFETY: `ptr` is a live block from mimalloc (every block of this allocator is).
    unsafe { MiMalloc.usable_size(ptr) }
}

// SAFETY: every block returned comes from mimalloc (`mi_malloc_aligned`, `mi_zalloc_aligned`); a
// reused block is a live mimalloc block no other owner holds (taken out of the cache under the
// lock) whose usable size is at least the request and whose address has the requested alignment.
// `dealloc` and `realloc` hand blocks back to mimalloc, whose `mi_free` and `mi_realloc_aligned`
// take any of its blocks.
unsafe impl GlobalAlloc for LargeBlockCache {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if Self::cached(layout)
            && let Some(p) = self.take(layout.size(), layout.align())
        {
            return p;
        }
        // SAFETY: forwarded as given.
        unsafe { MiMalloc.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !Self::cached(layout) {
            // SAFETY: forwarded as given.
            return unsafe { MiMalloc.alloc_zeroed(layout) };
        }
        // Zeroed by hand, not by `calloc`: a fresh `calloc` block maps the kernel's shared zero
        // page wherever it is only read (a zeros tensor that is copied, never written), and the
        // first write to such a page after the block is reused faults it in then.
        let p = match self.take(layout.size(), layout.align()) {
            Some(p) => p,
            // SAFETY: forwarded as given.
            None => unsafe { MiMalloc.alloc(layout) },
        };
        if !p.is_null() {
            // SAFETY: `p` holds at least `layout.size()` bytes (see `take`, or it was just allocated).
            unsafe { std::ptr::write_bytes(p, 0, layout.size()) };
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if Self::cached(layout) {
            for p in self.keep(ptr, usable_size(ptr)).into_iter().flatten() {
                // SAFETY: a mimalloc block this cache owned (kept or just evicted); `mi_free`
                // needs neither its size nor its alignment.
                unsafe { MiMalloc.dealloc(p as *mut u8, layout) };
            }
            return;
        }
        // SAFETY: forwarded as given.
        unsafe { MiMalloc.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: every block is a mimalloc block of `layout`'s alignment, so
        // `mi_realloc_aligned` may grow or shrink it.
        unsafe { MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_are_reused_and_small_ones_pass_through() {
        let cache = LargeBlockCache::new();
        let big = Layout::from_size_align(LARGE_BLOCK + 4096, 4).unwrap();
        // SAFETY: plain alloc/dealloc pairs of one layout through the cache under test.
        unsafe {
            let a = cache.alloc(big);
            a.write(7);
            cache.dealloc(a, big);
            assert!(cache.kept_bytes() >= big.size());
            // The same size comes back as the same block; zeroed when asked.
            let b = cache.alloc_zeroed(big);
            assert_eq!(a, b);
            assert_eq!(cache.hits(), 1);
            assert!((0..big.size()).step_by(4093).all(|i| *b.add(i) == 0));
            // A block is not spent on a request it is much larger than.
            cache.dealloc(b, big);
            let double = Layout::from_size_align(2 * LARGE_BLOCK + 8192, 4).unwrap();
            let d = cache.alloc(double);
            assert_ne!(d, b);
            d.add(double.size() - 1).write(1);
            cache.dealloc(d, double);
            let c = cache.alloc(big);
            assert_eq!(c, b, "the smallest block that fits");
            let e = cache.alloc(big);
            assert_ne!(e, d, "twice the size is not taken");
            cache.dealloc(c, big);
            cache.dealloc(e, big);
            let small = Layout::from_size_align(1024, 8).unwrap();
            let s = cache.alloc(small);
            cache.dealloc(s, small);
            assert_eq!(cache.hits(), 2, "only large blocks are reused");
        }
    }

    #[test]
    fn the_budget_evicts_the_oldest_blocks() {
        let cache = LargeBlockCache::new();
        cache.budget.store(3 * LARGE_BLOCK, Ordering::Relaxed);
        let big = Layout::from_size_align(LARGE_BLOCK, 16).unwrap();
        // SAFETY: alloc/dealloc pairs of one layout through the cache under test.
        unsafe {
            let blocks: Vec<*mut u8> = (0..4).map(|_| cache.alloc(big)).collect();
            for &b in &blocks {
                cache.dealloc(b, big);
            }
            // Usable sizes are a little above the request, so at most two fit three blocks' budget.
            assert!(cache.kept_bytes() <= 3 * LARGE_BLOCK);
            // The newest survives: the next request gets it, not the first one freed.
            let again = cache.alloc(big);
            assert_eq!(again, blocks[3]);
            cache.dealloc(again, big);
            // Growing a kept-and-reused block goes through mimalloc's realloc.
            let r = cache.alloc(big);
            r.write(3);
            let grown = cache.realloc(r, big, 2 * LARGE_BLOCK);
            assert_eq!(*grown, 3);
            cache.dealloc(grown, Layout::from_size_align(2 * LARGE_BLOCK, 16).unwrap());
            cache.budget.store(0, Ordering::Relaxed);
            let last = cache.alloc(big);
            cache.dealloc(last, big);
        }
    }

    #[test]
    fn blocks_not_reused_for_five_minutes_are_released() {
        let cache = LargeBlockCache::new();
        let big = Layout::from_size_align(LARGE_BLOCK, 16).unwrap();
        // SAFETY: blocks from mimalloc of one layout, handed to the cache under test once each.
        unsafe {
            let (a, b) = (MiMalloc.alloc(big), MiMalloc.alloc(big));
            assert!(cache.keep_at(a, usable_size(a), 10, 0).iter().all(Option::is_none));
            assert!(cache.keep_at(b, usable_size(b), 10 + MAX_AGE_S, 0).iter().all(Option::is_none), "not yet stale");
            let c = MiMalloc.alloc(big);
            let released = cache.keep_at(c, usable_size(c), 11 + MAX_AGE_S, 0);
            assert_eq!(released.iter().flatten().collect::<Vec<_>>(), vec![&(a as usize)]);
            MiMalloc.dealloc(a, big);
            assert_eq!(cache.kept_bytes(), usable_size(b) + usable_size(c));
        }
    }

    /// After a release (a model loaded), kept blocks are not reused and all go at the next free.
    #[test]
    fn a_release_hands_every_kept_block_back_at_the_next_free() {
        let cache = LargeBlockCache::new();
        let big = Layout::from_size_align(LARGE_BLOCK, 16).unwrap();
        // SAFETY: blocks from mimalloc of one layout, handed to the cache under test once each.
        unsafe {
            let (a, b, c) = (MiMalloc.alloc(big), MiMalloc.alloc(big), MiMalloc.alloc(big));
            assert!(cache.keep_at(a, usable_size(a), 0, 0).iter().all(Option::is_none));
            assert!(cache.keep_at(b, usable_size(b), 0, 0).iter().all(Option::is_none));
            assert_eq!(cache.take_after(big.size(), 16, 1), None, "a release is pending: nothing is reused");
            let released = cache.keep_at(c, usable_size(c), 0, 1);
            let mut freed: Vec<usize> = released.iter().flatten().copied().collect();
            freed.sort_unstable();
            let mut expected = vec![a as usize, b as usize];
            expected.sort_unstable();
            assert_eq!(freed, expected, "the blocks kept before the release");
            assert_eq!(cache.kept_bytes(), usable_size(c), "the block freed after it is kept");
            assert_eq!(cache.take_after(big.size(), 16, 1), Some(c), "and reused");
            MiMalloc.dealloc(a, big);
            MiMalloc.dealloc(b, big);
            MiMalloc.dealloc(c, big);
        }
    }
}
