//! What a download reports while it runs, and how a caller stops it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// A snapshot of a model download, sent after every chunk written.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// The file being fetched, as a path in the model's repository.
    pub file: String,
    /// 0-based position of `file` among the model's files.
    pub file_index: usize,
    pub file_count: usize,
    pub file_done: u64,
    pub file_total: u64,
    /// Bytes of the whole model on disk, resumed and already complete files included.
    pub done: u64,
    pub total: u64,
    /// Transfer speed over the last few seconds, in bytes per second.
    pub bytes_per_sec: f64,
}

impl Progress {
    /// Time left at the current speed; `None` before the speed is known.
    pub fn eta(&self) -> Option<Duration> {
        let left = self.total.saturating_sub(self.done);
        if left == 0 {
            return Some(Duration::ZERO);
        }
        (self.bytes_per_sec > 0.0)
            .then(|| Duration::from_secs_f64(left as f64 / self.bytes_per_sec))
    }
}

/// Speed over a sliding window, so a stall shows up within seconds and a burst does not linger.
#[derive(Debug)]
pub(crate) struct RateMeter {
    window: Duration,
    samples: VecDeque<(Instant, u64)>,
    received: u64,
}

impl RateMeter {
    pub fn new(window: Duration) -> Self {
        RateMeter {
            window,
            samples: VecDeque::new(),
            received: 0,
        }
    }

    /// Counts bytes received; they enter the speed at the next `sample`.
    pub fn add(&mut self, bytes: u64) {
        self.received += bytes;
    }

    pub fn sample(&mut self, now: Instant) {
        self.samples.push_back((now, self.received));
        while let Some(&(t, _)) = self.samples.front() {
            if now.duration_since(t) > self.window && self.samples.len() > 2 {
                self.samples.pop_front();
            } else {
                break;
            }
        }
    }

    pub fn bytes_per_sec(&self) -> f64 {
        match (self.samples.front(), self.samples.back()) {
            (Some(&(t0, b0)), Some(&(t1, b1))) if t1 > t0 => {
                (b1 - b0) as f64 / t1.duration_since(t0).as_secs_f64()
            }
            _ => 0.0,
        }
    }
}

/// Stops a download from another task or thread. The partial file stays, so the next download
/// resumes where this one stopped.
#[derive(Debug, Clone)]
pub struct CancelToken(Arc<watch::Sender<bool>>);

impl Default for CancelToken {
    fn default() -> Self {
        CancelToken(Arc::new(watch::Sender::new(false)))
    }
}

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cancel(&self) {
        self.0.send_replace(true);
    }

    pub fn is_cancelled(&self) -> bool {
        *self.0.borrow()
    }

    /// Completes once `cancel` has been called.
    pub async fn cancelled(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|c| *c).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_is_bytes_over_the_window() {
        let t0 = Instant::now();
        let mut m = RateMeter::new(Duration::from_secs(5));
        m.sample(t0);
        m.add(1000);
        m.sample(t0 + Duration::from_secs(1));
        m.add(1000);
        m.sample(t0 + Duration::from_secs(2));
        assert!((m.bytes_per_sec() - 1000.0).abs() < 1e-9);
        // Old samples fall out: only the last 5 s count.
        m.sample(t0 + Duration::from_secs(10));
        m.sample(t0 + Duration::from_secs(11));
        assert_eq!(m.bytes_per_sec(), 0.0);
    }

    #[test]
    fn eta_is_remaining_bytes_over_speed() {
        let p = Progress {
            file: "a".into(),
            file_index: 0,
            file_count: 1,
            file_done: 0,
            file_total: 1000,
            done: 200,
            total: 1000,
            bytes_per_sec: 100.0,
        };
        assert_eq!(p.eta(), Some(Duration::from_secs(8)));
        let stalled = Progress {
            bytes_per_sec: 0.0,
            ..p.clone()
        };
        assert_eq!(stalled.eta(), None);
        let done = Progress { done: 1000, ..p };
        assert_eq!(done.eta(), Some(Duration::ZERO));
    }

    #[tokio::test]
    async fn cancel_wakes_a_waiting_task() {
        let token = CancelToken::new();
        let waiter = {
            let token = token.clone();
            tokio::spawn(async move { token.cancelled().await })
        };
        assert!(!token.is_cancelled());
        token.cancel();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(token.is_cancelled());
        // Waiting after the fact returns at once.
        tokio::time::timeout(Duration::from_secs(5), token.cancelled())
            .await
            .unwrap();
    }
}
