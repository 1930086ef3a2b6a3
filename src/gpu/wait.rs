//! Waiting for a call's outputs. A wait blocked in the driver wakes the host some 0.1 ms after
//! the GPU finishes (README: an E2B-shaped decode step on an H200 took 2.69-2.74 ms a token so
//! against 2.78-2.88 blocked), so a call that replays a recording sleeps through most of the
//! time the last call of that recording took from its submit to its outputs, then polls until
//! they are mapped. Only the last `SPIN_TAIL` of a wait spends a core; a call with no history
//! polls from its submit, and one that runs long blocks after `MAX_SPIN`. A call expected to
//! take longer than `LONG_CALL` (a prompt, a slow GPU) blocks at once: the driver's wake-up is
//! small against it, and a sleep learned from one slow call (the first of a recording pays for
//! buffers' first use) would overshoot the next ones.

use std::time::{Duration, Instant};

use super::GpuError;

/// What the host polls for after its sleep: the sleep's overshoot and a step's jitter.
const SPIN_TAIL: Duration = Duration::from_micros(300);

/// The longest the host polls before it blocks in the driver (a long prefill, a slow GPU).
const MAX_SPIN: Duration = Duration::from_millis(2);

/// Sleeps shorter than this are not worth the scheduler's round trip.
const MIN_SLEEP: Duration = Duration::from_micros(50);

/// Calls expected to take longer than this block in the driver from their submit.
const LONG_CALL: Duration = Duration::from_millis(10);

/// Per recording: how long its last call took from submit to mapped outputs.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct WaitClock {
    expect: Option<Duration>,
}

impl WaitClock {
    /// When to start polling for a call submitted at `submitted`, if it is worth sleeping from
    /// `now` until then.
    fn wake_at(&self, submitted: Instant, now: Instant) -> Option<Instant> {
        let at = submitted + self.expect?.checked_sub(SPIN_TAIL)?;
        (at > now + MIN_SLEEP).then_some(at)
    }

    /// Whether the next call is expected to run long enough to block for it at once.
    fn long(&self) -> bool {
        self.expect.is_some_and(|e| e > LONG_CALL)
    }

    /// Learns from a call: `took` from submit to mapped outputs, `early` where they were ready
    /// at the first poll after the sleep (which then overslept, so `took` overstates the GPU:
    /// the next sleep is shorter than this one by a quarter, at least a `SPIN_TAIL`, so that a
    /// sleep learned from a slow call comes down in a few calls, not one `SPIN_TAIL` a call).
    fn record(&mut self, took: Duration, slept: Option<Duration>, early: bool) {
        self.expect = Some(match (early, slept) {
            (true, Some(s)) => s.saturating_sub(SPIN_TAIL.max(s / 4)) + SPIN_TAIL,
            _ => took,
        });
    }
}

/// Waits until `rx` hears from a `map_async` submitted at `submitted`: sleeps, polls, or blocks
/// as `clock` and `spin` say, and teaches `clock`. Returns the map's result, when it came, and
/// whether the host slept first.
pub(crate) fn await_map(
    device: &wgpu::Device,
    rx: &std::sync::mpsc::Receiver<Result<(), wgpu::BufferAsyncError>>,
    submitted: Instant,
    clock: &mut WaitClock,
    spin: bool,
) -> Result<(Result<(), wgpu::BufferAsyncError>, Instant, bool), GpuError> {
    let poll = |p: wgpu::PollType| device.poll(p).map_err(|e| GpuError::Device(e.to_string()));
    let gone = || GpuError::Device("reading outputs back: no answer".into());
    let mut slept = None;
    if spin && !clock.long() {
        let now = Instant::now();
        if let Some(at) = clock.wake_at(submitted, now) {
            std::thread::sleep(at - now);
            slept = Some(at - submitted);
        }
        let start = Instant::now();
        let mut first = true;
        while start.elapsed() < MAX_SPIN {
            poll(wgpu::PollType::Poll)?;
            match rx.try_recv() {
                Ok(r) => {
                    let done = Instant::now();
                    clock.record(done - submitted, slept, first);
                    return Ok((r, done, slept.is_some()));
                }
                Err(std::sync::mpsc::TryRecvError::Disconnected) => return Err(gone()),
                Err(std::sync::mpsc::TryRecvError::Empty) => {}
            }
            first = false;
            std::hint::spin_loop();
        }
    }
    poll(wgpu::PollType::wait_indefinitely())?;
    let done = Instant::now();
    let r = rx.recv().map_err(|_| gone())?;
    clock.record(done - submitted, None, false);
    Ok((r, done, slept.is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU taking `gpu` a call, the host waiting from its submit: the host's sleep, whether
    /// the outputs were ready at its first poll, and what the clock learns.
    fn call(clock: &mut WaitClock, gpu: Duration, overshoot: Duration) -> (Duration, bool) {
        let t0 = Instant::now();
        let sleep = clock.wake_at(t0, t0).map(|at| at - t0);
        let woke = sleep.map_or(Duration::ZERO, |s| s + overshoot);
        let early = woke >= gpu;
        let took = if early { woke } else { gpu };
        clock.record(took, sleep, sleep.is_some() && early);
        (sleep.unwrap_or(Duration::ZERO), early)
    }

    #[test]
    fn a_steady_step_sleeps_short_of_the_gpu_and_polls_the_rest() {
        let gpu = Duration::from_micros(2400);
        let mut clock = WaitClock::default();
        // The first call has no history: it polls from its submit.
        assert_eq!(
            call(&mut clock, gpu, Duration::ZERO),
            (Duration::ZERO, false)
        );
        for _ in 0..10 {
            let (sleep, early) = call(&mut clock, gpu, Duration::from_micros(60));
            assert_eq!(sleep, gpu - SPIN_TAIL);
            assert!(!early);
        }
    }

    #[test]
    fn an_oversleep_shortens_the_next_sleep_until_it_ends_before_the_gpu() {
        let mut clock = WaitClock::default();
        // A long call first, then the GPU gets faster: the host wakes after it is done, and
        // each such wake takes a SPIN_TAIL off the sleep until it wakes in time again.
        call(&mut clock, Duration::from_micros(4000), Duration::ZERO);
        let gpu = Duration::from_micros(2400);
        let mut sleeps = Vec::new();
        for _ in 0..12 {
            let (sleep, early) = call(&mut clock, gpu, Duration::from_micros(60));
            sleeps.push((sleep, early));
        }
        assert!(sleeps[0].1, "the first sleep after the long call overslept");
        assert!(sleeps.windows(2).all(|w| !w[0].1 || w[1].0 < w[0].0));
        let last = sleeps.last().unwrap();
        assert!(!last.1 && last.0 == gpu - SPIN_TAIL, "{sleeps:?}");
    }

    #[test]
    fn a_sleep_learned_from_a_slow_call_comes_down_in_a_few_calls() {
        // A first call of 9 ms (the buffers' first use, say), then 2 ms calls: one SPIN_TAIL a
        // call would oversleep 23 of them.
        let mut clock = WaitClock::default();
        call(&mut clock, Duration::from_micros(9000), Duration::ZERO);
        let gpu = Duration::from_micros(2000);
        let over = (0..30)
            .map(|_| call(&mut clock, gpu, Duration::from_micros(60)))
            .take_while(|&(_, early)| early)
            .count();
        assert!((1..=6).contains(&over), "{over} calls overslept");
        assert_eq!(
            call(&mut clock, gpu, Duration::from_micros(60)).0,
            gpu - SPIN_TAIL
        );
    }

    #[test]
    fn long_calls_block_rather_than_sleep() {
        // A prompt's call (the E2B-shaped program's first warm one on an H200 took 88 ms
        // where its GPU time was 19): the next blocks in the driver from its submit.
        let mut clock = WaitClock::default();
        assert!(!clock.long());
        clock.record(Duration::from_millis(88), None, false);
        assert!(clock.long());
        clock.record(Duration::from_millis(19), None, false);
        assert!(clock.long());
        clock.record(Duration::from_micros(2400), None, false);
        assert!(!clock.long());
    }

    #[test]
    fn a_short_call_does_not_sleep() {
        let mut clock = WaitClock::default();
        call(&mut clock, Duration::from_micros(200), Duration::ZERO);
        let now = Instant::now();
        assert_eq!(clock.wake_at(now, now), None);
    }
}
