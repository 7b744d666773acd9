//! Running a compute call on the rayon pool with its other threads kept awake: a decode step or
//! a training step is hundreds of small parallel loops and products, and a pool thread that went to
//! sleep between two of them takes longer to wake than many of them take to run.

use std::sync::atomic::{AtomicBool, Ordering};

/// Runs `f` on a thread of the current rayon pool while every other thread of the pool looks for
/// work (`rayon::yield_now`) instead of sleeping, until `f` returns. The other threads run any
/// parallel work `f` creates at once; when there is none they give the core to any other runnable
/// thread (`sched_yield`) and look again, so use this for calls that keep the machine busy anyway.
/// Yielding rather than spinning matters where `f` hands work to threads outside the pool:
/// candle's element-wise pool otherwise waits for a core held by a spinning thread (small train
/// step, 4 x 128 tokens, 2 cores: 6.46k -> 6.79k tok/s, alternating runs).
pub fn on_awake_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let done = AtomicBool::new(false);
    rayon::scope(|s| {
        for _ in 1..rayon::current_num_threads() {
            s.spawn(|_| {
                while !done.load(Ordering::Acquire) {
                    if rayon::yield_now() != Some(rayon::Yield::Executed) {
                        std::thread::yield_now();
                    }
                }
            });
        }
        let out = f();
        done.store(true, Ordering::Release);
        out
    })
}

#[cfg(test)]
mod tests {
    use rayon::prelude::*;

    #[test]
    fn the_call_returns_its_value_and_parallel_work_inside_it_completes() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let sum = pool.install(|| super::on_awake_pool(|| (0..10_000u64).into_par_iter().sum::<u64>()));
        assert_eq!(sum, 49_995_000);
        // With one thread there is nobody to keep awake.
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        assert_eq!(one.install(|| super::on_awake_pool(|| 7)), 7);
    }
}
