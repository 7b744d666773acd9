//! `orchestrator.tasks_per_minute`: group starts held to a rate, as prime-rl's limiter holds its
//! tasks (a bucket of a minute's allowance refilled continuously: a burst of up to that many, then
//! one every `60 / rate` seconds), for endpoints with rate limits (hosted judges, frozen actors).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The rate and the bucket (tokens may go negative: starts already promised a later slot).
#[derive(Debug)]
pub(crate) struct TaskRate {
    per_minute: f64,
    bucket: Mutex<(f64, Instant)>,
}

impl TaskRate {
    /// A full bucket of `per_minute` starts.
    pub(crate) fn new(per_minute: u32) -> Self {
        let per_minute = f64::from(per_minute.max(1));
        TaskRate { per_minute, bucket: Mutex::new((per_minute, Instant::now())) }
    }

    /// Takes the next start; how long it must wait from `now`.
    fn reserve(&self, now: Instant) -> Duration {
        let mut bucket = self.bucket.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (tokens, last) = &mut *bucket;
        let refill = now.saturating_duration_since(*last).as_secs_f64() * self.per_minute / 60.0;
        *tokens = (*tokens + refill).min(self.per_minute) - 1.0;
        *last = now.max(*last);
        if *tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-*tokens * 60.0 / self.per_minute) }
    }

    /// Waits until one more group may start.
    pub(crate) async fn acquire(&self) {
        let wait = self.reserve(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minutes_allowance_at_once_then_one_start_per_interval() {
        let rate = TaskRate::new(60);
        let t0 = Instant::now();
        for _ in 0..60 {
            assert_eq!(rate.reserve(t0), Duration::ZERO, "the first minute's allowance starts at once");
        }
        // Then one a second: the next three wait 1, 2 and 3 s from now.
        let waits: Vec<u64> = (0..3).map(|_| rate.reserve(t0).as_millis() as u64).collect();
        assert_eq!(waits, vec![1000, 2000, 3000]);
        // Ten seconds later the promised slots are past and seven more have accrued... minus the
        // three already promised: the next waits nothing, as do six after it.
        let later = t0 + Duration::from_secs(10);
        let free = (0..10).take_while(|_| rate.reserve(later).is_zero()).count();
        assert_eq!(free, 7);
    }
}
