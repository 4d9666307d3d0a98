//! [`Wakeup`]: a "there may be work" flag that a background thread sleeps on.
//!
//! The code that makes work (a timeline freezing a layer) holds an `Arc<Wakeup>` and knows
//! nothing of the loop that does the work; the loop waits on the same `Wakeup`. Notifications
//! never get lost, and many before the loop runs count as one.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

#[derive(Default)]
pub struct Wakeup {
    pending: Mutex<bool>,
    cond: Condvar,
}

impl Wakeup {
    pub fn new() -> Wakeup {
        Wakeup::default()
    }

    pub fn notify(&self) {
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cond.notify_one();
    }

    /// Sleeps until notified or until `timeout` passes; returns whether it was notified, and
    /// clears the notification.
    pub fn wait(&self, timeout: Duration) -> bool {
        let guard = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let (mut pending, _) = self
            .cond
            .wait_timeout_while(guard, timeout, |pending| !*pending)
            .unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_notification_before_the_wait_is_not_lost_and_counts_once() {
        let w = Wakeup::new();
        w.notify();
        w.notify();
        assert!(w.wait(Duration::from_secs(5)));
        assert!(!w.wait(Duration::from_millis(1)));
    }

    #[test]
    fn a_notification_from_another_thread_wakes_the_waiter() {
        let w = Arc::new(Wakeup::new());
        let notifier = std::thread::spawn({
            let w = w.clone();
            move || w.notify()
        });
        assert!(w.wait(Duration::from_secs(60)));
        notifier.join().unwrap();
    }
}
