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
//! It logs what it will download (layers and bytes), a line per layer downloaded with the
//! count and bytes so far against those totals, and a last line with what it did and why it
//! stopped; tenant and timeline info show the same progress as `resident_layers` and
//! `resident_bytes` (docs/http-api.md).

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
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

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
    let Some(tenant) = timelines.first().map(|t| t.tenant_id()) else {
        return 0;
    };
    let layers_total = layers.len();
    let bytes_total: u64 = layers.iter().map(|(_, c)| c.layer.file_size()).sum();
    tracing::info!(
        tenant = %tenant,
        layers_total,
        bytes_total,
        budget,
        "prefetching {layers_total} layer files ({bytes_total} bytes) of the attached tenant, newest first"
    );
    let queue = std::sync::Mutex::new(layers.into_iter());
    let (downloaded, failed) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let downloaded_bytes = AtomicU64::new(0);
    let (over_budget, shutting_down) = (AtomicBool::new(false), AtomicBool::new(false));
    // Bytes downloads in flight will add: the budget counts them before they land.
    let claimed = AtomicU64::new(0);
    let worker = || loop {
        let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
        let Some((timeline, copy)) = next else {
            return;
        };
        if timeline.is_shutting_down() {
            shutting_down.store(true, Ordering::Relaxed);
            return;
        }
        let size = copy.layer.file_size();
        // Claim first, then count what is resident: a download that lands between the two is
        // then counted in one of them (maybe both, which only stops early), never in neither;
        // the other order let two workers each miss the other's layer and pass the budget.
        let in_flight = claimed.fetch_add(size, Ordering::AcqRel);
        let resident: u64 = timelines.iter().map(|t| t.resident_layer_bytes()).sum();
        if budget != 0 && resident.saturating_add(in_flight).saturating_add(size) > budget {
            over_budget.store(true, Ordering::Relaxed);
            return;
        }
        match copy.layer.prefetch() {
            Ok(true) => {
                let done = downloaded.fetch_add(1, Ordering::Relaxed) + 1;
                let bytes = downloaded_bytes.fetch_add(size, Ordering::Relaxed) + size;
                tracing::info!(
                    tenant = %tenant,
                    timeline = %timeline.timeline_id(),
                    layer = copy.layer.file_name(),
                    size,
                    "prefetched layer {done} of {layers_total}, {bytes} of {bytes_total} bytes"
                );
            }
            Ok(false) => {}
            Err(e) => {
                failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(tenant = %tenant, timeline = %timeline.timeline_id(),
                    "prefetching a layer failed (a read will download it): {e}");
            }
        }
        claimed.fetch_sub(size, Ordering::AcqRel);
    };
    std::thread::scope(|s| {
        for _ in 0..PREFETCH_THREADS {
            s.spawn(worker);
        }
    });
    let (done, bytes) = (downloaded.into_inner(), downloaded_bytes.into_inner());
    let why = if shutting_down.into_inner() {
        "stopped: the tenant is shutting down"
    } else if over_budget.into_inner() {
        "stopped: the rest would not fit in max_local_layer_bytes"
    } else {
        "done"
    };
    // The rest of the total: downloaded by a read first, or failed (a read downloads those).
    let failed = failed.into_inner();
    tracing::info!(
        tenant = %tenant,
        layers = done,
        bytes,
        failed,
        "prefetched {done} of {layers_total} layer files, {bytes} of {bytes_total} bytes; {why}"
    );
    done
}
