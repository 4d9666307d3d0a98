//! The local disk as a cache of remote storage: the eviction loop keeps the layer files on the
//! local disk within `max_local_layer_bytes`, and an attach's prefetch fills it, newest first.
//!
//! Eviction, one pass a tick: when the resident layer files of every timeline (all L0s, and the
//! resident L1 and image layers) weigh more than the budget, the least recently read L1 and
//! image layers that the store holds are evicted until they fit. L0 layers are never evicted
//! (they are few, new, and compacted soon); a layer the store does not hold yet never is. A
//! read of an evicted layer downloads it again (`storage_layer::on_demand`), which may take
//! the disk over the budget until the next pass.
//!
//! Prefetch, once after an attach: the on-demand layers of the tenant's timelines are
//! downloaded in the background, the newest first (by the end of their LSN range, images
//! before deltas at one end), for as long as they fit in the budget; reads do not wait for it.

use std::sync::Arc;

use crate::tenant::timeline::{LocalCopy, Timeline};

/// What one eviction pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EvictionOutcome {
    pub resident_bytes: u64,
    pub layers_evicted: usize,
    pub bytes_evicted: u64,
}

/// One eviction pass over `timelines` with a budget of `budget` bytes (0: no budget).
pub fn run_pass(timelines: &[Arc<Timeline>], budget: u64) -> EvictionOutcome {
    let resident: u64 = timelines.iter().map(|t| t.resident_layer_bytes()).sum();
    let mut outcome = EvictionOutcome {
        resident_bytes: resident,
        ..EvictionOutcome::default()
    };
    if budget == 0 || resident <= budget {
        return outcome;
    }
    let mut candidates: Vec<LocalCopy> = timelines
        .iter()
        .flat_map(|t| t.on_demand_layers())
        .filter(|c| c.evictable && c.layer.is_resident())
        .collect();
    candidates.sort_by_key(|c| c.layer.last_read_ms());
    let mut over = resident - budget;
    for copy in candidates {
        if over == 0 {
            break;
        }
        if copy.layer.evict() {
            let size = copy.layer.file_size();
            over = over.saturating_sub(size);
            outcome.layers_evicted += 1;
            outcome.bytes_evicted += size;
        }
    }
    outcome.resident_bytes = outcome.resident_bytes.saturating_sub(outcome.bytes_evicted);
    crate::metrics::LAYER_EVICTIONS.inc_by(outcome.layers_evicted as u64);
    crate::metrics::LAYER_EVICTED_BYTES.inc_by(outcome.bytes_evicted);
    if outcome.layers_evicted > 0 {
        tracing::info!(
            layers = outcome.layers_evicted,
            bytes = outcome.bytes_evicted,
            resident_bytes = outcome.resident_bytes,
            budget,
            "evicted the least recently read layer files over max_local_layer_bytes"
        );
    }
    outcome
}

/// Layer downloads a prefetch runs at once.
const PREFETCH_THREADS: usize = 4;

/// Downloads the on-demand layers of `timelines`, newest first (`PREFETCH_THREADS` at a time),
/// while they fit in `budget` (0: no budget); stops early once a timeline shuts down. Returns
/// the layers downloaded.
pub fn prefetch(timelines: &[Arc<Timeline>], budget: u64) -> usize {
    let mut layers: Vec<(Arc<Timeline>, LocalCopy)> = timelines
        .iter()
        .flat_map(|t| {
            t.on_demand_layers()
                .into_iter()
                .map(move |c| (t.clone(), c))
        })
        .filter(|(_, c)| !c.layer.is_resident())
        .collect();
    layers.sort_by_key(|(_, c)| {
        (
            std::cmp::Reverse(c.layer.lsn_range().end),
            !c.layer.is_image(),
        )
    });
    let queue = std::sync::Mutex::new(layers.into_iter());
    let downloaded = std::sync::atomic::AtomicUsize::new(0);
    // Bytes downloads in flight will add: the budget counts them before they land.
    let claimed = std::sync::atomic::AtomicU64::new(0);
    let worker = || loop {
        let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
        let Some((timeline, copy)) = next else {
            return;
        };
        if timeline.is_shutting_down() {
            return;
        }
        let size = copy.layer.file_size();
        let resident: u64 = timelines.iter().map(|t| t.resident_layer_bytes()).sum();
        let in_flight = claimed.fetch_add(size, std::sync::atomic::Ordering::AcqRel);
        if budget != 0 && resident.saturating_add(in_flight).saturating_add(size) > budget {
            return;
        }
        match copy.layer.prefetch() {
            Ok(true) => {
                downloaded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(tenant = %timeline.tenant_id(), timeline = %timeline.timeline_id(),
                    "prefetching a layer failed (a read will download it): {e}");
            }
        }
        claimed.fetch_sub(size, std::sync::atomic::Ordering::AcqRel);
    };
    std::thread::scope(|s| {
        for _ in 0..PREFETCH_THREADS {
            s.spawn(worker);
        }
    });
    downloaded.into_inner()
}
