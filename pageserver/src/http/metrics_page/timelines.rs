//! [`TimelineCollector`]: each timeline's LSNs, upload queue and layers, one series per
//! timeline (labels `tenant_id`, `timeline_id`), read from the timelines the tenant manager
//! holds at the scrape.
//!
//! A timeline's series exist exactly while the manager holds it: once it is deleted, or its
//! tenant deleted or detached, the next scrape has none of them, with nothing to unregister.
//!
//! The walk holds no lock of its own: the manager's and each tenant's map are read-locked only
//! to clone their `Arc`s, and each timeline's layers are read from its current layer map
//! snapshot, an `Arc` too. Nothing here does I/O.

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;

use super::family::Family;
use crate::tenant::mgr::TenantManager;
use crate::tenant::timeline::LayerKind;

/// The layer kinds, as the `kind` label names them, in the order of those names. The registry
/// sorts each family's series by their label values; the tenant manager's maps already yield
/// tenants and timelines in the order of their ids, so series made in this order are sorted
/// before the registry looks, and its sort is one pass that moves nothing.
const LAYER_KINDS: [(LayerKind, &str); 4] = [
    (LayerKind::Delta, "delta"),
    (LayerKind::Frozen, "frozen"),
    (LayerKind::Image, "image"),
    (LayerKind::Open, "open"),
];

/// See the module documentation.
pub struct TimelineCollector {
    tenants: Arc<TenantManager>,
    last_record_lsn: Family,
    disk_consistent_lsn: Family,
    remote_consistent_lsn: Family,
    upload_queue_bytes: Family,
    layers: Family,
    layer_files: Family,
    layer_bytes: Family,
}

impl TimelineCollector {
    pub fn new(tenants: Arc<TenantManager>) -> TimelineCollector {
        let ids = &["tenant_id", "timeline_id"];
        let ids_and_kind = &["tenant_id", "timeline_id", "kind"];
        TimelineCollector {
            tenants,
            last_record_lsn: Family::gauge(
                "pageserver_last_record_lsn",
                "Newest LSN ingested",
                ids,
            ),
            disk_consistent_lsn: Family::gauge(
                "pageserver_disk_consistent_lsn",
                "Newest LSN whose versions are all in fsynced layer files",
                ids,
            ),
            remote_consistent_lsn: Family::gauge(
                "pageserver_remote_consistent_lsn",
                "Newest LSN whose versions are all in remote storage (the newest uploaded index)",
                ids,
            ),
            upload_queue_bytes: Family::gauge(
                "pageserver_upload_queue_bytes",
                "Bytes of committed layer files waiting for upload",
                ids,
            ),
            layers: Family::gauge(
                "pageserver_layers",
                "Layers per timeline by kind",
                ids_and_kind,
            ),
            layer_files: Family::gauge(
                "pageserver_layer_files",
                "Layer files per timeline by level: L0 (the count ingest backpressure watches), \
                 L1, image",
                &["tenant_id", "timeline_id", "level"],
            ),
            layer_bytes: Family::gauge(
                "pageserver_layer_bytes",
                "Bytes of layers per timeline by kind",
                ids_and_kind,
            ),
        }
    }
}

impl Collector for TimelineCollector {
    fn desc(&self) -> Vec<&Desc> {
        [
            &self.last_record_lsn,
            &self.disk_consistent_lsn,
            &self.remote_consistent_lsn,
            &self.upload_queue_bytes,
            &self.layers,
            &self.layer_files,
            &self.layer_bytes,
        ]
        .map(Family::desc)
        .to_vec()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let timelines: Vec<_> = self
            .tenants
            .list_tenants()
            .iter()
            .flat_map(|tenant| {
                tenant
                    .list_timelines()
                    .into_iter()
                    .map(|timeline| (tenant.remote_client(timeline.timeline_id()), timeline))
            })
            .collect();
        let n = timelines.len();
        let mut last_record_lsn = self.last_record_lsn.fill(n);
        let mut disk_consistent_lsn = self.disk_consistent_lsn.fill(n);
        let mut remote_consistent_lsn = self.remote_consistent_lsn.fill(n);
        let mut upload_queue_bytes = self.upload_queue_bytes.fill(n);
        let mut layers = self.layers.fill(n * LAYER_KINDS.len());
        let mut layer_files = self.layer_files.fill(n * 3);
        let mut layer_bytes = self.layer_bytes.fill(n * LAYER_KINDS.len());
        for (remote, timeline) in &timelines {
            let tenant_id = timeline.tenant_id().to_string();
            let timeline_id = timeline.timeline_id().to_string();
            let ids = [tenant_id.as_str(), timeline_id.as_str()];
            last_record_lsn.add(&ids, timeline.last_record_lsn().0 as f64);
            disk_consistent_lsn.add(&ids, timeline.disk_consistent_lsn().0 as f64);
            if let Some(lsn) = timeline.remote_consistent_lsn() {
                remote_consistent_lsn.add(&ids, lsn.0 as f64);
            }
            if let Some(remote) = remote {
                upload_queue_bytes.add(&ids, remote.queued_bytes() as f64);
            }
            let described = timeline.layers();
            for (kind, name) in LAYER_KINDS {
                let (count, bytes) = described
                    .iter()
                    .filter(|l| l.kind == kind)
                    .fold((0u64, 0u64), |(c, b), l| (c + 1, b + l.size_bytes));
                layers.add(&[ids[0], ids[1], name], count as f64);
                layer_bytes.add(&[ids[0], ids[1], name], bytes as f64);
            }
            let counts = timeline.layer_counts();
            for (level, files) in [
                ("L0", counts.l0),
                ("L1", counts.l1),
                ("image", counts.images),
            ] {
                layer_files.add(&[ids[0], ids[1], level], files as f64);
            }
        }
        vec![
            last_record_lsn.done(),
            disk_consistent_lsn.done(),
            remote_consistent_lsn.done(),
            upload_queue_bytes.done(),
            layers.done(),
            layer_files.done(),
            layer_bytes.done(),
        ]
    }
}
