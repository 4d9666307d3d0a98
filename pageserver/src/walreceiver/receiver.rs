//! The receivers of a server, one thread each, and the loop each runs (see the module
//! documentation of `walreceiver`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pageserver_api::datadir::{snapshot_list_key, SnapshotList};
use postgres_wal::{segment, WalDecoder};
use serde::{Deserialize, Serialize};
use utils::{Lsn, TenantId, TimelineId};

use super::base_backup;
use super::connection::{ReplicationConnection, StreamMessage};
use super::connstr::ConnString;
use super::pg_replay::PgPrograms;
use super::snapshots::SnapshotConf;
use super::state::{ReceiverState, Shared, StateName};
use super::timelines;
use super::wal_store::WalStore;
use super::ReceiverError;
use crate::io::crashsafe::{StagedFile, TEMP_SUFFIX};
use crate::io::virtual_file::FileIo;
use crate::tenant::timeline::Timeline;

/// The receiver's durable settings, in the timeline's directory.
const RECEIVER_FILE: &str = crate::tenant::timeline::WAL_RECEIVER_FILE;
/// How long connecting, and each answer before streaming, may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a read waits before the loop looks at its stop flag and its status timer.
const POLL: Duration = Duration::from_millis(100);
/// A status update at least this often, so the primary's `wal_sender_timeout` (60 s) never
/// ends a quiet stream.
const STATUS_INTERVAL: Duration = Duration::from_secs(1);
/// Unflushed WAL is flushed and reported at least every this many bytes, also while more
/// keeps arriving.
const FLUSH_AT_LEAST_EVERY: u64 = 4 << 20;
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// What `PUT .../wal_receiver` takes, and what is stored.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiverConf {
    pub connstr: String,
    pub slot_name: String,
    pub application_name: String,
    /// Whether the WAL's records also become the timeline's page versions (`page_ingest.rs`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ingest_pages: bool,
    /// Background snapshots (`snapshots.rs`): one after each this many bytes of WAL; 0 turns
    /// them off; absent, the server's `snapshot_wal_distance`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_wal_distance: Option<u64>,
}

impl ReceiverConf {
    /// Checks the settings: a connection string that parses, a slot name PostgreSQL takes
    /// (lower-case letters, digits, underscores, at most 63).
    pub fn check(&self) -> Result<ConnString, ReceiverError> {
        let conn = ConnString::parse(&self.connstr).map_err(ReceiverError::Settings)?;
        let name_ok = |n: &str| {
            !n.is_empty()
                && n.len() <= 63
                && n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        if !name_ok(&self.slot_name) {
            return Err(ReceiverError::Settings(format!(
                "slot_name `{}`: 1 to 63 lower-case letters, digits and underscores",
                self.slot_name
            )));
        }
        if self.application_name.is_empty()
            || self.application_name.len() > 63
            || !self.application_name.is_ascii()
        {
            return Err(ReceiverError::Settings(
                "application_name: 1 to 63 ASCII characters".to_owned(),
            ));
        }
        Ok(conn)
    }
}

struct Handle {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Page ingest's thread, if the settings ask for it.
    pages: Option<JoinHandle<()>>,
    /// The background snapshots' thread, if they are on.
    snapshots: Option<JoinHandle<()>>,
}

/// The server's settings for background snapshots (`snapshots.rs`).
#[derive(Clone, Debug)]
pub struct SnapshotSettings {
    /// `snapshot_wal_distance`, where a receiver's settings do not say.
    pub distance: u64,
    pub pg_bin_dir: Option<std::path::PathBuf>,
    pub pg_user: Option<String>,
    /// Where the replay runs, one at a time.
    pub replay_dir: std::path::PathBuf,
}

impl Handle {
    /// Stops both threads and waits for them.
    fn stop(&mut self) {
        self.shared.stop();
        for thread in [self.thread.take(), self.pages.take(), self.snapshots.take()]
            .into_iter()
            .flatten()
        {
            let _ = thread.join();
        }
    }
}

/// Every receiver of the server.
pub struct Receivers {
    map: Mutex<HashMap<(TenantId, TimelineId), Handle>>,
    /// Held over a whole start or removal, so that two never interleave (the one would leave
    /// a thread the other cannot stop, or remove the settings the other stored).
    changing: Mutex<()>,
    /// A stream the primary sends nothing on for this long is given up and connected again
    /// (`wal_receiver_timeout`); after half of it, the receiver asks for an answer.
    timeout: Duration,
    snapshots: SnapshotSettings,
}

impl Receivers {
    pub fn new(timeout: Duration, snapshots: SnapshotSettings) -> Arc<Receivers> {
        Arc::new(Receivers {
            map: Mutex::new(HashMap::new()),
            changing: Mutex::new(()),
            timeout,
            snapshots,
        })
    }

    fn map(&self) -> MutexGuard<'_, HashMap<(TenantId, TimelineId), Handle>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts streaming into `timeline` with `conf`, replacing a receiver it had: connects,
    /// checks the primary and starts replication here, so that a refusal is the caller's
    /// answer (and the receiver it would have replaced resumes); then stores the settings and
    /// hands the stream to a thread of its own.
    pub fn start(
        &self,
        timeline: Arc<Timeline>,
        conf: ReceiverConf,
    ) -> Result<ReceiverState, ReceiverError> {
        let conn = conf.check()?;
        let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        self.stop_thread(timeline.tenant_id(), timeline.timeline_id());
        let shared = Arc::new(Shared::new(
            initial_state(&conf, &conn, self.snapshot_distance(&conf)),
            self.timeout,
        ));
        let session = match Session::establish(&timeline, &conf, &conn, &shared) {
            Ok(session) => session,
            Err(e) => {
                // The receiver it replaced (stopped first: the two may share a slot, which
                // serves one connection at a time) goes on with its stored settings.
                if let Err(resumed) = self.resume(timeline) {
                    tracing::warn!(
                        "the WAL receiver a refused one replaced does not restart: {resumed}"
                    );
                }
                return Err(e);
            }
        };
        store_conf(timeline.dir(), &conf)?;
        if let Some(remote) = timeline.remote_copy() {
            remote.set_wal_receiver(serde_json::to_value(&conf).ok());
        }
        let state = shared.state().clone();
        self.spawn(timeline, conf, conn, shared, Some(session));
        Ok(state)
    }

    /// Starts the receiver `timeline`'s stored settings name, if it has any (a server's start).
    pub fn resume(&self, timeline: Arc<Timeline>) -> Result<bool, ReceiverError> {
        let Some(conf) = load_conf(timeline.dir())? else {
            return Ok(false);
        };
        let conn = conf.check()?;
        let shared = Arc::new(Shared::new(
            initial_state(&conf, &conn, self.snapshot_distance(&conf)),
            self.timeout,
        ));
        self.spawn(timeline, conf, conn, shared, None);
        Ok(true)
    }

    fn spawn(
        &self,
        timeline: Arc<Timeline>,
        conf: ReceiverConf,
        conn: ConnString,
        shared: Arc<Shared>,
        session: Option<Session>,
    ) {
        let key = (timeline.tenant_id(), timeline.timeline_id());
        // The one it replaces stops first: two page ingests of one timeline would race.
        let replaced = self.map().remove(&key);
        if let Some(mut old) = replaced {
            old.stop();
        }
        let distance = self.snapshot_distance(&conf);
        let snapshot_conf = (distance > 0).then(|| {
            let settings = &self.snapshots;
            SnapshotConf {
                distance,
                replay_dir: settings.replay_dir.clone(),
                programs: PgPrograms::find(
                    settings.pg_bin_dir.as_deref(),
                    settings.pg_user.as_deref(),
                ),
            }
        });
        // Before page ingest starts (after a restart it has stored WAL to read at once): held
        // where the next snapshot goes, so it does not pass that unseen.
        if let Some(conf) = &snapshot_conf {
            super::snapshots::hold_at_next(&timeline, &shared, conf);
        }
        let pages = conf.ingest_pages.then(|| {
            let (timeline, shared) = (timeline.clone(), shared.clone());
            std::thread::Builder::new()
                .name(format!("pageingest-{}", timeline.timeline_id()))
                .spawn(move || super::page_ingest::run(timeline, shared))
                .expect("spawning a thread")
        });
        let snapshots = snapshot_conf.map(|conf| {
            let (timeline, shared) = (timeline.clone(), shared.clone());
            std::thread::Builder::new()
                .name(format!("snapshots-{}", timeline.timeline_id()))
                .spawn(move || super::snapshots::run(timeline, shared, conf))
                .expect("spawning a thread")
        });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("walreceiver-{}", timeline.timeline_id()))
            .spawn(move || run(timeline, conf, conn, thread_shared, session))
            .expect("spawning a thread");
        self.map().insert(
            key,
            Handle {
                shared,
                thread: Some(thread),
                pages,
                snapshots,
            },
        );
    }

    /// The distance between background snapshots `conf` asks for (0: none).
    fn snapshot_distance(&self, conf: &ReceiverConf) -> u64 {
        conf.snapshot_wal_distance
            .unwrap_or(self.snapshots.distance)
    }

    pub fn state(&self, tenant: TenantId, timeline: TimelineId) -> Option<ReceiverState> {
        self.map()
            .get(&(tenant, timeline))
            .map(|h| h.shared.state().clone())
    }

    /// Stops the receiver and forgets its settings; with `drop_slot`, drops its slot on the
    /// primary. `false` if there was none.
    pub fn remove(&self, timeline: &Timeline, drop_slot: bool) -> Result<bool, ReceiverError> {
        let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let conf = load_conf(timeline.dir())?;
        let had = self.stop_thread(timeline.tenant_id(), timeline.timeline_id());
        if conf.is_none() && !had {
            return Ok(false);
        }
        // The index first: a crash before the local file goes leaves a receiver that a
        // restart resumes, never one that an attach elsewhere brings back after its removal.
        if let Some(remote) = timeline.remote_copy() {
            remote.set_wal_receiver(None);
        }
        match std::fs::remove_file(timeline.dir().join(RECEIVER_FILE)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(ReceiverError::Io(e)),
            _ => {}
        }
        crate::io::crashsafe::fsync_dir(timeline.dir()).map_err(ReceiverError::Io)?;
        if let (true, Some(conf)) = (drop_slot, conf) {
            let conn = conf.check()?;
            let mut c =
                ReplicationConnection::connect(&conn, &conf.application_name, CONNECT_TIMEOUT)?;
            c.drop_slot(&conf.slot_name)?;
        }
        Ok(true)
    }

    fn stop_thread(&self, tenant: TenantId, timeline: TimelineId) -> bool {
        let handle = self.map().remove(&(tenant, timeline));
        let Some(mut handle) = handle else {
            return false;
        };
        handle.stop();
        true
    }

    /// Stops the receivers of `tenant`'s timelines (before a detach or a deletion); their
    /// settings stay.
    pub fn stop_tenant(&self, tenant: TenantId) {
        let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let keys: Vec<_> = self.map().keys().copied().collect();
        for (t, timeline) in keys.into_iter().filter(|(t, _)| *t == tenant) {
            self.stop_thread(t, timeline);
        }
    }

    /// Stops the receiver of one timeline (before its deletion); its settings stay.
    pub fn stop_timeline(&self, tenant: TenantId, timeline: TimelineId) {
        let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        self.stop_thread(tenant, timeline);
    }

    /// Stops every receiver (a server's shutdown); their settings stay.
    pub fn stop_all(&self) {
        let keys: Vec<_> = self.map().keys().copied().collect();
        for (tenant, timeline) in keys {
            self.stop_thread(tenant, timeline);
        }
    }
}

fn initial_state(conf: &ReceiverConf, conn: &ConnString, snapshot_distance: u64) -> ReceiverState {
    ReceiverState {
        state: StateName::Connecting,
        connstr: conn.to_string(),
        slot_name: conf.slot_name.clone(),
        application_name: conf.application_name.clone(),
        system_id: None,
        timeline: None,
        tls: None,
        received_lsn: None,
        flushed_lsn: None,
        archived_lsn: None,
        primary_wal_end: None,
        lag_bytes: None,
        last_message_ms: None,
        last_error: None,
        ingest_pages: conf.ingest_pages,
        pages_lsn: None,
        pages_error: None,
        snapshot_wal_distance: snapshot_distance,
        snapshot_running: false,
        snapshot_lsn: None,
        snapshot_error: None,
    }
}

fn store_conf(dir: &Path, conf: &ReceiverConf) -> Result<(), ReceiverError> {
    let bytes =
        serde_json::to_vec_pretty(conf).map_err(|e| ReceiverError::Settings(e.to_string()))?;
    let staged = StagedFile::create(
        dir,
        &format!("{RECEIVER_FILE}{TEMP_SUFFIX}"),
        "wal-receiver",
    )
    .map_err(|e| ReceiverError::Settings(e.to_string()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(staged.temp_path(), std::fs::Permissions::from_mode(0o600))
        .map_err(ReceiverError::Io)?;
    staged
        .file()
        .write_all_at(&bytes, 0)
        .map_err(ReceiverError::Io)?;
    staged
        .commit(RECEIVER_FILE)
        .map_err(|e| ReceiverError::Settings(e.to_string()))?;
    Ok(())
}

fn load_conf(dir: &Path) -> Result<Option<ReceiverConf>, ReceiverError> {
    match std::fs::read(dir.join(RECEIVER_FILE)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ReceiverError::Settings(format!("{RECEIVER_FILE}: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ReceiverError::Io(e)),
    }
}

/// A replication stream set up and started.
struct Session {
    conn: ReplicationConnection,
    segment_size: u32,
    store: WalStore,
    decoder: WalDecoder,
    /// The timeline streamed (PostgreSQL's TLI).
    tli: u32,
    slot: String,
}

impl Session {
    fn establish(
        timeline: &Arc<Timeline>,
        conf: &ReceiverConf,
        conn_string: &ConnString,
        shared: &Shared,
    ) -> Result<Session, ReceiverError> {
        let mut conn =
            ReplicationConnection::connect(conn_string, &conf.application_name, CONNECT_TIMEOUT)?;
        let mut ident = conn.identify_system()?;
        let segment_size = wal_segment_size(&mut conn)?;
        let read_snapshots = || {
            timeline
                .get_page(snapshot_list_key(), timeline.last_record_lsn())
                .map_err(|e| {
                    ReceiverError::Refused(format!("reading the timeline's snapshots: {e}"))
                })
        };
        let snapshots = match read_snapshots()? {
            Some(list) => list,
            None => {
                // A timeline with nothing yet: a base backup over this connection first, with
                // the slot created before it, so that the WAL from the backup's start stays
                // until streaming starts there.
                conn.create_slot(&conf.slot_name)?;
                {
                    let mut s = shared.state();
                    s.state = StateName::BaseBackup;
                    s.system_id = Some(ident.system_id.to_string());
                }
                let report = base_backup::take_base_backup(&mut conn, timeline)?;
                tracing::info!(tenant = %timeline.tenant_id(), timeline = %timeline.timeline_id(),
                    lsn = %report.lsn, "imported the primary's base backup");
                // The backup moved the primary's WAL on (its checkpoint, its switch).
                ident = conn.identify_system()?;
                read_snapshots()?.ok_or_else(|| {
                    ReceiverError::Refused("the base backup imported no snapshot".to_owned())
                })?
            }
        };
        let snapshots = SnapshotList::decode(&snapshots)
            .map_err(|e| ReceiverError::Refused(format!("the timeline's snapshot list: {e}")))?;
        if snapshots.system_identifier != ident.system_id {
            return Err(ReceiverError::Refused(format!(
                "the primary is database system {}, the timeline's snapshots are of {}: another cluster",
                ident.system_id, snapshots.system_identifier
            )));
        }
        let newest = snapshots.snapshots.last().map_or(Lsn(0), |s| s.lsn);
        let (store, stored) =
            WalStore::open(timeline.dir(), segment_size).map_err(ReceiverError::Io)?;
        // From the start of the newest stored segment (its bytes written again), else of the
        // segment that holds the newest snapshot's LSN; the later of the two, when a snapshot
        // newer than the WAL stored was imported (a new slot may not keep the older WAL).
        let snapshot_start =
            segment::segment_start(segment::segno_of(newest, segment_size), segment_size);
        // After an attach elsewhere the local disk has nothing, and the store has what the
        // last attachment archived: from the start of its newest segment.
        let archived_start = timeline
            .remote_copy()
            .and_then(|r| r.archived_lsn())
            .map_or(Lsn(0), |a| {
                segment::segment_start(segment::segno_of(a, segment_size), segment_size)
            });
        // The primary's line of timelines, its history files stored; the WAL held here must
        // be on it (`timelines.rs`).
        let (line, history_files) = timelines::primary_line(&mut conn, ident.timeline)?;
        let known = timelines::known_wal(timeline, stored, segment_size)?;
        if let Some(known) = &known {
            // Its branches read its WAL up to their branch points: those must be on the
            // primary's line too. (Not its snapshots: one imported from the new primary after
            // a failover is on the new line, and its WAL up to it is the old line's.)
            let fixed = timeline.branch_points().into_iter().max().unwrap_or(Lsn(0));
            timelines::check_line(&line, known, fixed)?;
        }
        timelines::store_history(&store, &history_files)?;
        // A branch with no WAL of its own: from the segment its ancestor's WAL ends in at the
        // branch point (the primary started from the branch has it, and nothing older).
        let branch_start = known
            .filter(|k| k.branch_lsn.is_some())
            .map_or(Lsn(0), |k| {
                segment::segment_start(segment::segno_of(k.end, segment_size), segment_size)
            });
        let start = match stored {
            Some(stored) => stored.segment.start(segment_size).max(snapshot_start),
            None => snapshot_start,
        }
        .max(archived_start)
        .max(branch_start);
        if start > ident.xlogpos {
            return Err(ReceiverError::Refused(format!(
                "the primary's WAL ends at {}, before {start} where the timeline's WAL goes on: a \
                 primary restored from an older backup, or another cluster",
                ident.xlogpos
            )));
        }
        conn.create_slot(&conf.slot_name)?;
        // On the timeline the primary's line holds at the start, as a standby would: the
        // primary ends its stream where the line goes on to the next one.
        let tli = line.tli_of(start);
        conn.start_replication(&conf.slot_name, start, tli).map_err(|e| match e {
            ReceiverError::Server { code, message } if message.contains("has already been removed") => {
                ReceiverError::Refused(format!(
                    "the primary no longer has the WAL at {start} ({code}: {message}); the WAL between the timeline's newest snapshot and now is lost: import a new base backup"
                ))
            }
            e => e,
        })?;
        let mut store = store;
        store.start_at(start);
        if let Some(stored) = stored {
            store.verify_up_to(stored.valid_end);
        }
        {
            let mut s = shared.state();
            s.state = StateName::Streaming;
            s.system_id = Some(ident.system_id.to_string());
            s.timeline = Some(tli);
            s.tls = Some(conn.is_tls());
            s.received_lsn = Some(start);
            shared.set_flushed(&mut s, stored.map_or(start, |s| s.valid_end).max(start));
            s.archived_lsn = timeline.remote_copy().and_then(|r| r.archived_lsn());
            s.primary_wal_end = Some(ident.xlogpos);
            s.last_error = None;
        }
        shared.segment_size.store(segment_size, Ordering::Release);
        Ok(Session {
            conn,
            segment_size,
            store,
            // Records are only checked here, never kept: a record's header at most is held,
            // whatever length the primary's WAL claims for it.
            decoder: WalDecoder::new(start, segment_size).keeping_records_up_to(0),
            tli,
            slot: conf.slot_name.clone(),
        })
    }

    /// Streams until the connection fails, the timeline shuts down or the receiver is stopped.
    fn stream(&mut self, timeline: &Timeline, shared: &Shared) -> Result<(), ReceiverError> {
        let mut last_status = Instant::now();
        let mut last_message = Instant::now();
        let mut pinged = false;
        let mut unflushed = false;
        loop {
            if shared.stop.load(Ordering::Acquire) || timeline.is_shutting_down() {
                return Ok(());
            }
            // A primary (or a network) that went silent: asked for an answer once, then given up.
            let silent = last_message.elapsed();
            if silent >= shared.timeout {
                return Err(ReceiverError::Connect(format!(
                    "the primary sent nothing for {:?} (wal_receiver_timeout)",
                    shared.timeout
                )));
            }
            if silent >= shared.timeout / 2 && !pinged {
                self.status(timeline, shared, true)?;
                pinged = true;
            }
            // Everything the primary already sent, then one fsync and one status update for
            // all of it: a synchronous primary's commits wait for that update.
            let wait = if unflushed { Duration::ZERO } else { POLL };
            let message = self.conn.next_stream_message(wait)?;
            if message.is_some() {
                last_message = Instant::now();
                pinged = false;
            }
            match message {
                Some(StreamMessage::XLogData {
                    start,
                    wal_end,
                    data,
                }) => {
                    if start != self.store.written() {
                        return Err(ReceiverError::Protocol(format!(
                            "WAL from {start} where {} was next",
                            self.store.written()
                        )));
                    }
                    self.decoder.feed(&data);
                    while self.decoder.next_record()?.is_some() {}
                    self.store
                        .write(self.tli, start, &data)
                        .map_err(|e| match e.kind() {
                            // Another history than the WAL stored: no retry changes it.
                            std::io::ErrorKind::InvalidData => {
                                ReceiverError::Refused(e.to_string())
                            }
                            _ => ReceiverError::Io(e),
                        })?;
                    unflushed = true;
                    // A primary that sends faster than this drains would otherwise never see
                    // its WAL flushed while it sends.
                    if self.store.written().0 - self.store.flushed().0 >= FLUSH_AT_LEAST_EVERY
                        || last_status.elapsed() >= STATUS_INTERVAL
                    {
                        self.store.flush().map_err(ReceiverError::Io)?;
                        self.status(timeline, shared, false)?;
                        unflushed = false;
                        last_status = Instant::now();
                    }
                    let mut s = shared.state();
                    s.received_lsn = Some(self.store.written());
                    s.primary_wal_end = Some(wal_end.max(self.store.written()));
                    s.last_message_ms = Some(now_ms());
                }
                Some(StreamMessage::Keepalive {
                    wal_end,
                    reply_requested,
                }) => {
                    {
                        let mut s = shared.state();
                        s.primary_wal_end = Some(wal_end);
                        s.last_message_ms = Some(now_ms());
                    }
                    if reply_requested {
                        self.status(timeline, shared, false)?;
                        last_status = Instant::now();
                    }
                }
                Some(StreamMessage::CopyDone) => {
                    // The end of a timeline that is not the primary's newest (or a shutdown,
                    // which closes the connection while the next timeline is asked for).
                    self.store.flush().map_err(ReceiverError::Io)?;
                    self.status(timeline, shared, false)?;
                    let (next, at) = self.conn.end_of_timeline()?;
                    self.follow_switch(timeline, shared, next, at)?;
                    unflushed = false;
                    last_status = Instant::now();
                }
                None => {
                    if unflushed || last_status.elapsed() >= STATUS_INTERVAL {
                        self.store.flush().map_err(ReceiverError::Io)?;
                        self.status(timeline, shared, false)?;
                        unflushed = false;
                        last_status = Instant::now();
                    }
                }
            }
        }
    }

    /// The primary's WAL goes on as timeline `next` from `at`: its history stored and checked,
    /// the store moved to it, and streaming started again there.
    fn follow_switch(
        &mut self,
        timeline: &Timeline,
        shared: &Shared,
        next: u32,
        at: Lsn,
    ) -> Result<(), ReceiverError> {
        let written = self.store.written();
        if at != written {
            // PostgreSQL streams a timeline exactly to where the next one begins.
            return Err(ReceiverError::Protocol(format!(
                "the primary switched to timeline {next} at {at}, and its stream of timeline {} \
                 ended at {written}",
                self.tli
            )));
        }
        let (history, bytes) = timelines::fetch_history(&mut self.conn, next)?;
        timelines::check_switch(&history, self.tli, at)?;
        timelines::store_history(&self.store, &[(next, bytes)])?;
        self.store
            .switch_timeline(next, at)
            .map_err(ReceiverError::Io)?;
        tracing::info!(tenant = %timeline.tenant_id(), timeline = %timeline.timeline_id(),
            "the primary's WAL goes on as timeline {next} from {at}");
        self.conn.start_replication(&self.slot, at, next)?;
        self.tli = next;
        shared.state().timeline = Some(next);
        Ok(())
    }

    fn status(
        &mut self,
        timeline: &Timeline,
        shared: &Shared,
        reply_requested: bool,
    ) -> Result<(), ReceiverError> {
        let flushed = self.store.flushed();
        let remote = timeline.remote_copy();
        if let Some(remote) = remote {
            remote.wal_flushed(self.store.dir(), self.tli, self.segment_size, flushed);
        }
        {
            let mut s = shared.state();
            shared.set_flushed(&mut s, flushed);
            s.archived_lsn = remote.and_then(|r| r.archived_lsn());
            s.lag_bytes = s.primary_wal_end.map(|end| end.0.saturating_sub(flushed.0));
        }
        // Applied: what is durable here is all this receiver does with the WAL yet.
        self.conn
            .send_status(self.store.written(), flushed, flushed, reply_requested)
    }
}

/// The primary's `wal_segment_size`, in bytes.
fn wal_segment_size(conn: &mut ReplicationConnection) -> Result<u32, ReceiverError> {
    let rows = conn.simple_query("SHOW wal_segment_size")?;
    let text = rows
        .first()
        .and_then(|r| r.first())
        .and_then(|v| v.clone())
        .ok_or_else(|| {
            ReceiverError::Protocol("SHOW wal_segment_size answered nothing".to_owned())
        })?;
    let bytes = utils::units::parse_size(&text.replace("MB", "MiB").replace("GB", "GiB"))
        .map_err(|e| ReceiverError::Protocol(format!("wal_segment_size `{text}`: {e}")))?;
    u32::try_from(bytes)
        .ok()
        .filter(|&b| segment::is_valid_segment_size(b))
        .ok_or_else(|| {
            ReceiverError::Protocol(format!("wal_segment_size `{text}` is not a segment size"))
        })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A receiver's thread: streams, and after a failure waits and connects again, until stopped.
fn run(
    timeline: Arc<Timeline>,
    conf: ReceiverConf,
    conn: ConnString,
    shared: Arc<Shared>,
    mut session: Option<Session>,
) {
    let mut backoff = BACKOFF_MIN;
    loop {
        if shared.stop.load(Ordering::Acquire) || timeline.is_shutting_down() {
            break;
        }
        let result = match session.take() {
            Some(mut s) => s.stream(&timeline, &shared),
            None => {
                shared.state().state = StateName::Connecting;
                Session::establish(&timeline, &conf, &conn, &shared).and_then(|mut s| {
                    backoff = BACKOFF_MIN;
                    s.stream(&timeline, &shared)
                })
            }
        };
        match result {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(tenant = %timeline.tenant_id(), timeline = %timeline.timeline_id(),
                    "WAL receiver: {e}");
                let permanent = e.is_permanent();
                let mut s = shared.state();
                s.last_error = Some(e.to_string());
                if permanent {
                    s.state = StateName::Stopped;
                    return;
                }
                s.state = StateName::WaitingRetry;
            }
        }
        let until = Instant::now() + backoff;
        while Instant::now() < until {
            if shared.stop.load(Ordering::Acquire) || timeline.is_shutting_down() {
                break;
            }
            std::thread::sleep(POLL.min(until.saturating_duration_since(Instant::now())));
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
    shared.state().state = StateName::Stopped;
}
