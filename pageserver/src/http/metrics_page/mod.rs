//! The `/metrics` page: every metric family of the server, rendered by one pass of the
//! `prometheus` crate's `TextEncoder` over two registries' families, merged in name order.
//!
//! - The crate's default registry holds the counters, gauges and histograms of
//!   [`crate::metrics`], counted where events happen (a leaf any module counts into).
//! - The page's own [`Registry`], made once with the router ([`MetricsPage::new`]), holds
//!   collectors that read state other modules own, at every scrape, rather than mirror it:
//!   [`caches`] (the page cache's and the scan cursor cache's counters), [`timelines`] (each
//!   timeline's LSNs, upload queue and layers), [`server`] (the build, the HTTP limits) and
//!   [`process`] (`/proc/self`).
//!
//! Invariants:
//!
//! - What is read at a scrape cannot drift from the truth and needs no cleanup: a timeline's
//!   series are there while the tenant manager holds the timeline and gone from the next scrape
//!   after it is deleted or its tenant deleted or detached.
//! - A scrape keeps nothing. The collectors' descriptors ([`family::Family`]) are made once;
//!   each scrape builds fresh families, encodes them and drops them. Nothing grows with the
//!   number of scrapes, and two scrapes at once share nothing mutable.
//! - No lock is held across I/O. The collectors take no lock of their own: the timeline walk
//!   clones `Arc`s under the tenant maps' read locks and lets go, the page cache's stats are
//!   atomics (and a pass over its slots' pin counts), and the cursor cache runs its pending
//!   evictions in memory before reading its counters. A registry read-locks its collectors
//!   while it gathers (the process collector reads `/proc/self` then), but a registry is
//!   write-locked only when a collector is registered, at startup, so no one waits for it.
//! - A name belongs to one family: each registry refuses a second family of a name it holds,
//!   and a test renders the page and checks the two registries together.
//! - A family with no series is left out (the registry prunes it): the per-timeline families
//!   on a server without timelines, `pageserver_remote_consistent_lsn` and
//!   `pageserver_upload_queue_bytes` without remote storage, a `/proc/self` figure that could
//!   not be read.
//! - Values are `f64`s, as Prometheus stores them: integers (LSNs, bytes) are exact up to 2^53.
//! - The handler renders on the blocking pool: a page of thousands of timelines takes
//!   milliseconds of CPU (docs/benchmarks.md, `metrics_page`), which no async worker serving
//!   reads should spend.
//!
//! It lives beside the HTTP code, not in `metrics.rs`, because it reads state that belongs to
//! other modules; `metrics.rs` imports nothing of ours.

pub mod caches;
pub mod family;
pub mod process;
pub mod server;
pub mod timelines;

use std::sync::atomic::{AtomicUsize, Ordering};

use prometheus::core::Collector;
use prometheus::{Registry, TextEncoder};

use super::SharedState;

/// See the module documentation.
pub struct MetricsPage {
    /// The collectors that read state at scrape time.
    read_at_scrape: Registry,
    /// The length of the last page rendered: the next one's starting capacity, so that a page
    /// of megabytes is not regrown (and copied) some twenty times as it fills.
    last_len: AtomicUsize,
}

impl MetricsPage {
    pub fn new(state: &SharedState) -> MetricsPage {
        let read_at_scrape = Registry::new();
        let collectors: [Box<dyn Collector>; 6] = [
            Box::new(caches::PageCacheCollector::new(state.cache.clone())),
            Box::new(caches::CursorCacheCollector::new(state.clone())),
            Box::new(timelines::TimelineCollector::new(state.tenants.clone())),
            Box::new(server::BuildInfoCollector::default()),
            Box::new(server::HttpLimitsCollector::new(
                state.connections.clone(),
                state.body_budget.clone(),
            )),
            Box::new(process::ProcessCollector::new(state.started_at)),
        ];
        for collector in collectors {
            read_at_scrape
                .register(collector)
                .expect("the page's collectors describe distinct families");
        }
        MetricsPage {
            read_at_scrape,
            last_len: AtomicUsize::new(0),
        }
    }

    /// The whole page, in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut families = prometheus::gather();
        families.extend(self.read_at_scrape.gather());
        families.sort_unstable_by(|a, b| a.name().cmp(b.name()));
        // A little room over the last length: the page grows as timelines come.
        let hint = self.last_len.load(Ordering::Relaxed);
        let mut page = String::with_capacity(hint + hint / 8);
        TextEncoder::new()
            .encode_utf8(&families, &mut page)
            .expect("gathered families have a name and a series each");
        self.last_len.store(page.len(), Ordering::Relaxed);
        page
    }
}

#[cfg(test)]
mod tests;
