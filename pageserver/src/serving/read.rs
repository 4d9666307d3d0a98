//! The read path under both doors: one recipe for every read a client asks for (HTTP's page
//! and scan, the page service's GetPage, GetPages batches and relation sizes).
//!
//! 1. The timeline, looked up for every request (and every batch of a stream), so that a
//!    client never reads a timeline object that was detached, re-attached or deleted since.
//! 2. The LSN: the one asked for, or the timeline's last record LSN for "latest", resolved once
//!    per request; the read waits for it to be ingested as a task, not on a thread, so a client
//!    that hangs up ends its wait.
//! 3. The read, measured ([`read_cost::measure`]): in place on the async worker when the page
//!    cache holds all it needs ([`read`]), otherwise on the blocking pool, with any layer
//!    download done under the admission bounds while the read holds no thread.
//! 4. Its cost, handed back for the door to send; for GetPage and GetPages also counted into
//!    the `pageserver_getpage_*` totals ([`read_cost::record`]), whether or not the page was
//!    found. A scan page and a relation size are not GetPage requests and stay out of them.
//!
//! Auth is checked before any of this, by each door ([`super::auth`] decides); what each door
//! times and counts per request (its latency histograms) stays with the door.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pageserver_api::datadir::{decode_rel_size, RelTag};
use pageserver_api::Key;
use utils::{Lsn, TenantId, TimelineId};

use super::error::ServeError;
use super::work::blocking;
use crate::io::read_cost::{self, ReadCost};
use crate::tenant::admission::Admissions;
use crate::tenant::mgr::TenantManager;
use crate::tenant::timeline::scan::cursor_cache::{CursorCache, ScanRequest, ScanResult};
use crate::tenant::timeline::{Timeline, TimelineError};

/// What every read needs: the tenants, the bounds on downloads, how long a read waits for
/// its LSN, and the cursors of paged scans between their pages.
pub struct PageReads {
    tenants: Arc<TenantManager>,
    admissions: Arc<Admissions>,
    wait_lsn_timeout: Duration,
    scan_cursors: CursorCache,
}

/// One page as of an LSN.
#[derive(Debug)]
pub struct PageAnswer {
    /// `None`: the key has no version at or below `lsn`.
    pub page: Option<Bytes>,
    /// The LSN read at ("latest" resolved).
    pub lsn: Lsn,
    pub cost: ReadCost,
}

/// A batch of pages, each as of its own LSN.
#[derive(Debug)]
pub struct PagesAnswer {
    /// In the order asked, each with the LSN it was read at ("latest" resolved).
    pub pages: Vec<(Option<Bytes>, Lsn)>,
    pub cost: ReadCost,
}

/// Where a read may run.
#[derive(Clone, Copy)]
enum Run {
    /// In place when the page cache holds everything, else on the blocking pool.
    InPlaceIfCached,
    /// On the blocking pool: too long for an async worker even when all is cached.
    OnPool,
}

impl PageReads {
    pub fn new(
        tenants: Arc<TenantManager>,
        admissions: Arc<Admissions>,
        wait_lsn_timeout: Duration,
        scan_cursors: CursorCache,
    ) -> PageReads {
        PageReads {
            tenants,
            admissions,
            wait_lsn_timeout,
            scan_cursors,
        }
    }

    pub fn scan_cursors(&self) -> &CursorCache {
        &self.scan_cursors
    }

    /// The timeline as it is now (step 1).
    pub fn timeline(
        &self,
        tenant: TenantId,
        timeline: TimelineId,
    ) -> Result<Arc<Timeline>, ServeError> {
        Ok(self.tenants.get_timeline(tenant, timeline)?)
    }

    /// Page `key` as of `lsn` (`None`: the latest).
    pub async fn page(
        &self,
        timeline: Arc<Timeline>,
        key: Key,
        lsn: Option<Lsn>,
    ) -> Result<PageAnswer, ServeError> {
        let lsn = lsn.unwrap_or_else(|| timeline.last_record_lsn());
        let (page, cost) = self
            .measured(&timeline, lsn, Run::InPlaceIfCached, move |timeline| {
                timeline.get_page(key, lsn)
            })
            .await?;
        read_cost::record(&cost, 1);
        Ok(PageAnswer {
            page: page.map_err(|e| ServeError::from(e).with_cost(cost))?,
            lsn,
            cost,
        })
    }

    /// The pages of a batch, each as of its LSN (`None`: the latest, the same for the whole
    /// batch); the batch waits for its highest LSN.
    pub async fn pages(
        &self,
        timeline: Arc<Timeline>,
        batch: Vec<(Key, Option<Lsn>)>,
    ) -> Result<PagesAnswer, ServeError> {
        let latest = timeline.last_record_lsn();
        let batch: Arc<Vec<(Key, Lsn)>> = Arc::new(
            batch
                .into_iter()
                .map(|(key, lsn)| (key, lsn.unwrap_or(latest)))
                .collect(),
        );
        let highest = batch.iter().map(|(_, lsn)| *lsn).max().unwrap_or(latest);
        let requests = batch.clone();
        let (pages, cost) = self
            .measured(&timeline, highest, Run::InPlaceIfCached, move |timeline| {
                timeline.get_pages(&requests)
            })
            .await?;
        read_cost::record(&cost, batch.len());
        let pages = pages?
            .into_iter()
            .zip(batch.iter())
            .map(|(page, (_, lsn))| (page, *lsn))
            .collect();
        Ok(PagesAnswer { pages, cost })
    }

    /// The size of `rel` in blocks as of `lsn` (`None`: the latest), `None` if the fork does
    /// not exist there; and the LSN read at.
    pub async fn rel_size(
        &self,
        timeline: Arc<Timeline>,
        rel: RelTag,
        lsn: Option<Lsn>,
    ) -> Result<(Option<u32>, Lsn), ServeError> {
        let lsn = lsn.unwrap_or_else(|| timeline.last_record_lsn());
        let (value, _cost) = self
            .measured(&timeline, lsn, Run::InPlaceIfCached, move |timeline| {
                timeline.get_page(rel.size_key(), lsn)
            })
            .await?;
        let blocks = value?
            .map(|bytes| {
                decode_rel_size(&bytes).map_err(|e| {
                    ServeError::internal(format!("the stored size of {}: {e}", rel_text(&rel)))
                })
            })
            .transpose()?;
        Ok((blocks, lsn))
    }

    /// A page of a paged key scan, finished by `answer` on the pool (an HTTP answer's JSON of
    /// up to about 11 MiB is written there, off the async workers).
    pub async fn scan_page<T, F>(
        self: &Arc<Self>,
        timeline: Arc<Timeline>,
        request: ScanRequest,
        answer: F,
    ) -> Result<(T, ReadCost), ServeError>
    where
        F: Fn(ScanResult) -> T + Send + Sync + 'static,
        T: Send + 'static,
    {
        let reads = self.clone();
        let (result, cost) = self
            .measured(&timeline, request.lsn, Run::OnPool, move |timeline| {
                Ok(answer(reads.scan_cursors.page(timeline, request)?))
            })
            .await?;
        Ok((result?, cost))
    }

    /// Steps 2 and 3: waits for `lsn`, then runs `read_from` where `run` says, measured. The
    /// read's own error is the inner result, so that a caller can count its cost either way.
    async fn measured<T, F>(
        &self,
        timeline: &Arc<Timeline>,
        lsn: Lsn,
        run: Run,
        read_from: F,
    ) -> Result<(Result<T, TimelineError>, ReadCost), ServeError>
    where
        F: Fn(&Timeline) -> Result<T, TimelineError> + Send + Sync + 'static,
        T: Send + 'static,
    {
        timeline.wait_lsn(lsn, self.wait_lsn_timeout).await?;
        let timeline = timeline.clone();
        let measured = move || read_cost::measure(|| read_from(&timeline));
        match run {
            Run::InPlaceIfCached => read(&self.admissions, measured).await,
            Run::OnPool => read_on_pool(&self.admissions, measured).await,
        }
    }
}

/// A relation fork as messages name it.
pub fn rel_text(rel: &RelTag) -> String {
    format!(
        "relation {}/{}/{} fork {}",
        rel.spcnode, rel.dbnode, rel.relnode, rel.forknum
    )
}

/// How many times a read runs again after downloads it needed before it gives up: each run
/// makes at least one more layer resident, unless eviction takes them away as fast.
const MAX_READ_DOWNLOAD_ROUNDS: u32 = 16;

/// Runs a read here, on the async worker, when it needs no disk I/O (a hot page: see
/// [`crate::io::cached_only`]), and otherwise on the blocking pool, where it may wait for the
/// disk but not for the object store: a layer it needs that is not on the local disk is
/// downloaded under `admissions`' bounds on a thread of its own while this task waits (holding
/// no thread), and the read runs again. No thread hand-off for what the page cache holds, no
/// blocked worker for what it does not, no pool thread held by a slow store. `read` may run
/// several times, so it must not count anything itself; its result is kept only from the run
/// that finished.
async fn read<T, F>(admissions: &Admissions, read: F) -> Result<T, ServeError>
where
    F: Fn() -> T + Send + Sync + 'static,
    T: Send + 'static,
{
    // A panic in place fails this call as one on the blocking pool would, and no more.
    let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        crate::io::cached_only::try_cached(&read)
    }));
    match attempt {
        Ok(Some(done)) => {
            crate::metrics::READS_IN_PLACE.inc();
            return Ok(done);
        }
        Ok(None) => {}
        Err(_) => return Err(ServeError::internal("the read panicked")),
    }
    read_on_pool(admissions, read).await
}

/// [`read`] without the attempt in place: for reads too long to run on an async worker even
/// when the page cache holds everything (a page of a scan).
async fn read_on_pool<T, F>(admissions: &Admissions, read: F) -> Result<T, ServeError>
where
    F: Fn() -> T + Send + Sync + 'static,
    T: Send + 'static,
{
    let read = Arc::new(read);
    let mut downloads = 0;
    for _ in 0..MAX_READ_DOWNLOAD_ROUNDS {
        let this_run = read.clone();
        let outcome = blocking(move || {
            crate::io::read_cost::carry_downloads(downloads);
            let outcome = crate::io::cached_only::without_downloads(|| this_run());
            crate::io::read_cost::carry_downloads(0);
            Ok::<_, ServeError>(outcome)
        })
        .await?;
        match outcome {
            Ok(done) => return Ok(done),
            Err(pending) => {
                admissions.download(pending).await?;
                downloads += 1;
            }
        }
    }
    Err(ServeError::try_again(format!(
        "the layers this read needs were evicted again as fast as they were downloaded \
         ({MAX_READ_DOWNLOAD_ROUNDS} rounds); try again shortly"
    )))
}
