//! [`ProcessCollector`]: the process, read from `/proc/self` at every scrape, under the names
//! Prometheus client libraries use: open and maximum descriptors, resident and virtual memory,
//! CPU seconds, threads, start time. Linux only, like the server. A file that cannot be read
//! leaves its families out rather than failing the scrape.
//!
//! The `prometheus` crate has a process collector of its own, behind a feature that pulls in
//! `procfs`; these few fields are read here instead, from the same files.

use std::time::{SystemTime, UNIX_EPOCH};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;

use super::family::Family;

/// What `/proc/self/stat` counts CPU time in: USER_HZ, which Linux fixes at 100 per second for
/// every architecture's user-space ABI (`sysconf(_SC_CLK_TCK)` reports the same constant).
const CLOCK_TICKS_PER_SECOND: f64 = 100.0;

/// What `/proc/self` says of this process; `None` where it could not be read.
#[derive(Debug, Default, PartialEq)]
pub struct ProcessStats {
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub resident_bytes: Option<u64>,
    pub virtual_bytes: Option<u64>,
    pub threads: Option<u64>,
    pub cpu_seconds: Option<f64>,
}

pub fn read_process() -> ProcessStats {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    ProcessStats {
        open_fds: std::fs::read_dir("/proc/self/fd")
            .ok()
            // The directory handle read_dir holds is one of the entries; it is not ours to count.
            .map(|entries| (entries.count() as u64).saturating_sub(1)),
        max_fds: crate::config::open_files_limit(),
        resident_bytes: status_kib(&status, "VmRSS:").map(|kib| kib * 1024),
        virtual_bytes: status_kib(&status, "VmSize:").map(|kib| kib * 1024),
        threads: status_kib(&status, "Threads:"),
        cpu_seconds: cpu_seconds(&stat),
    }
}

/// The number after `field` in `/proc/self/status` (kB for the memory fields).
fn status_kib(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..].split_whitespace().next()?.parse().ok()
}

/// User plus system CPU time from `/proc/self/stat`. Its second field, the command name in
/// parentheses, may hold spaces, so fields are counted after the last `)`: utime and stime are
/// the 14th and 15th fields, the 12th and 13th after it.
fn cpu_seconds(stat: &str) -> Option<f64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / CLOCK_TICKS_PER_SECOND)
}

/// See the module documentation.
pub struct ProcessCollector {
    started_at: SystemTime,
    open_fds: Family,
    max_fds: Family,
    resident_bytes: Family,
    virtual_bytes: Family,
    threads: Family,
    cpu_seconds: Family,
    start_time: Family,
}

impl ProcessCollector {
    pub fn new(started_at: SystemTime) -> ProcessCollector {
        ProcessCollector {
            started_at,
            open_fds: Family::gauge("process_open_fds", "Open file descriptors", &[]),
            max_fds: Family::gauge(
                "process_max_fds",
                "The open file descriptor limit (RLIMIT_NOFILE, soft)",
                &[],
            ),
            resident_bytes: Family::gauge(
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                &[],
            ),
            virtual_bytes: Family::gauge(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                &[],
            ),
            threads: Family::gauge("process_threads", "OS threads", &[]),
            cpu_seconds: Family::counter(
                "process_cpu_seconds_total",
                "User and system CPU time spent in seconds",
                &[],
            ),
            start_time: Family::gauge(
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch in seconds",
                &[],
            ),
        }
    }
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        [
            &self.open_fds,
            &self.max_fds,
            &self.resident_bytes,
            &self.virtual_bytes,
            &self.threads,
            &self.cpu_seconds,
            &self.start_time,
        ]
        .map(Family::desc)
        .to_vec()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let stats = read_process();
        let read = [
            (&self.open_fds, stats.open_fds),
            (&self.max_fds, stats.max_fds),
            (&self.resident_bytes, stats.resident_bytes),
            (&self.virtual_bytes, stats.virtual_bytes),
            (&self.threads, stats.threads),
        ];
        let mut families: Vec<MetricFamily> = read
            .into_iter()
            .filter_map(|(family, value)| Some(family.single(value? as f64)))
            .collect();
        families.extend(stats.cpu_seconds.map(|s| self.cpu_seconds.single(s)));
        if let Ok(started) = self.started_at.duration_since(UNIX_EPOCH) {
            families.push(self.start_time.single(started.as_secs_f64()));
        }
        families
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        // A command name with spaces and a parenthesis; utime 250 and stime 50 ticks.
        let stat = "1234 (page server) x) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 42 1000 500";
        assert_eq!(cpu_seconds(stat), Some(3.0));
        assert_eq!(cpu_seconds("garbage"), None);
    }

    #[test]
    fn this_process_is_readable() {
        let stats = read_process();
        assert!(stats.open_fds.unwrap() >= 3, "{stats:?}");
        assert!(stats.resident_bytes.unwrap() > 1 << 20, "{stats:?}");
        assert!(stats.virtual_bytes.unwrap() >= stats.resident_bytes.unwrap());
        assert!(stats.threads.unwrap() >= 1);
        assert!(stats.cpu_seconds.unwrap() >= 0.0);
        assert_eq!(
            status_kib("Name:\tx\nVmRSS:\t  2048 kB\n", "VmRSS:"),
            Some(2048)
        );
    }
}
