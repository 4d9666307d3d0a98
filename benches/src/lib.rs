//! Benchmarks live in `benches/`; this crate only hosts them.

use std::time::Duration;

use pageserver::format::compression::Compression;
use pageserver::tenant::timeline::TimelineConf;

/// The default settings with layers that store pages as they are: what the in-process
/// benchmarks' figures in docs/benchmarks.md were measured with, and what they measure (the
/// layout of uncompressed pages; the server compresses by default since 2026-11-29).
pub fn uncompressed() -> TimelineConf {
    TimelineConf {
        layer_compression: Compression::Off,
        ..TimelineConf::default()
    }
}

/// The CPU time the calling thread has used: what a benchmark of work done on one thread
/// measures, whatever else the machine runs meanwhile.
pub fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}
