//! Fault injection (`test_remote_failures = N`): each operation on a key fails its first N
//! attempts, counted again from zero after a success, so a test exercises every retry path
//! deterministically.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::RemotePath;

pub(crate) struct FaultInjection {
    tries: u32,
    /// Failed attempts so far, by operation and key.
    attempts: Mutex<HashMap<(&'static str, RemotePath), u32>>,
}

impl FaultInjection {
    pub(crate) fn new(tries: u32) -> FaultInjection {
        FaultInjection {
            tries,
            attempts: Mutex::new(HashMap::new()),
        }
    }

    /// Whether this attempt of `op` on `key` fails; counts it if so.
    pub(crate) fn should_fail(&self, op: &'static str, key: &RemotePath) -> bool {
        let mut attempts = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
        let failed = attempts.entry((op, key.clone())).or_insert(0);
        if *failed < self.tries {
            *failed += 1;
            true
        } else {
            false
        }
    }

    /// `op` on `key` went through: the next one fails its first tries again.
    pub(crate) fn succeeded(&self, op: &'static str, key: &RemotePath) {
        let mut attempts = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
        attempts.remove(&(op, key.clone()));
    }
}
