//! A stock PostgreSQL replaying a data directory to an LSN and shutting down there: the work
//! of a background snapshot (`snapshots.rs`).
//!
//! ```text
//!   basebackup with replay (the snapshot below, the WAL up to the end S of the target record)
//!     ──unpacked──▶ snapshot_replay_dir   (owned by pg_user when the server is root)
//!     ──stop_before: an online checkpoint record put at N (where the next record starts),
//!       a no-op record after it──▶
//!     ──postgres -D … -c recovery_target_lsn=<the no-op> -c recovery_target_action=shutdown──▶
//!   shut down in recovery with its restartpoint at N: every page as at S
//!     ──pg_control checked, recovery's files and pg_wal/'s segments removed──▶ tar ─▶ import
//! ```
//!
//! PostgreSQL writes every page it changed to the data files only at a restartpoint, and makes
//! one only at a checkpoint record it replayed; at a shutdown without one its data files are
//! older than the replay. The checkpoint record put at N (in this copy of the WAL only) is
//! that record: the restartpoint there, made at the shutdown, writes every page, and
//! `pg_control` names that checkpoint (checked: a directory whose restartpoint is elsewhere is
//! refused).
//!
//! The server is one process among the primary's own PostgreSQL programs: the replay listens on
//! no TCP port (a Unix socket in a private directory only), archives nothing, and syncs
//! nothing (the directory is read once, and dropped on any failure). Its configuration files
//! are its own, in that private directory, not the primary's (which a Debian cluster keeps
//! outside its data directory, and which size memory for the primary's host): 128 MB of shared
//! buffers, and the primary's `max_prepared_transactions` from `pg_control`. It is stopped (`SIGQUIT`,
//! PostgreSQL's immediate shutdown) when the snapshot is cancelled or takes too long.

use std::fs;
use std::io;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use postgres_wal::edit::{encode_record, next_record_start, place_record, record_end};
use postgres_wal::page::{PageHeader, LONG_HEADER_LEN};
use postgres_wal::record::{RM_XLOG_ID, XLOG_NOOP};
use postgres_wal::segment::{segment_files_in, segno_of};
use postgres_wal::{SegmentName, XLOG_BLCKSZ, XLOG_PAGE_MAGIC};
use utils::Lsn;

use crate::datadir::checkpoint_start::checkpoint_record;
use crate::datadir::pg_control::{self, Checkpoint, ControlFile};

/// The lines the basebackup appends to `postgresql.auto.conf` start with this.
const ADDED_SETTINGS: &str = "\n# Added by the pageserver: replay the WAL in pg_wal/";
const AUTO_CONF: &str = "postgresql.auto.conf";
/// What PostgreSQL leaves in the directory for its recovery: not part of a snapshot.
const RECOVERY_FILES: [&str; 6] = [
    "recovery.signal",
    "standby.signal",
    crate::datadir::PROMOTE_TRIGGER_FILE,
    "backup_label.old",
    "postmaster.opts",
    "postmaster.pid",
];
const DB_SHUTDOWNED_IN_RECOVERY: u32 = 2;
const POLL: Duration = Duration::from_millis(100);

/// The PostgreSQL programs a replay runs, and who they run as.
#[derive(Clone, Debug)]
pub struct PgPrograms {
    pub bin_dir: PathBuf,
    /// The user and group to run as (the server is root), or none (run as the server).
    pub run_as: Option<(u32, u32)>,
}

impl PgPrograms {
    /// Finds the programs: `bin_dir`, else `pg_config --bindir`, else `postgres` on the `PATH`,
    /// else the newest of Debian's `/usr/lib/postgresql/*/bin`; and the user, which must be
    /// given when the server runs as root.
    pub fn find(bin_dir: Option<&Path>, user: Option<&str>) -> Result<PgPrograms, String> {
        let bin_dir = match bin_dir {
            Some(dir) => dir.to_owned(),
            None => default_bin_dir().ok_or(
                "no PostgreSQL programs found (pg_config --bindir, postgres on the PATH, \
                 /usr/lib/postgresql/*/bin): set pg_bin_dir",
            )?,
        };
        if !bin_dir.join("postgres").is_file() {
            return Err(format!(
                "pg_bin_dir {}: no postgres program there",
                bin_dir.display()
            ));
        }
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let run_as = match (root, user) {
            (false, _) => None,
            (true, None) => {
                return Err(
                    "the server runs as root, which PostgreSQL refuses: set pg_user to \
                            the user it runs as"
                        .to_owned(),
                )
            }
            (true, Some(user)) => Some(user_ids(user)?),
        };
        Ok(PgPrograms { bin_dir, run_as })
    }
}

fn default_bin_dir() -> Option<PathBuf> {
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|dir| dir.join("postgres").is_file());
    from_pg_config
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH")?)
                .find(|dir| dir.join("postgres").is_file())
        })
        .or_else(|| {
            let mut found: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
                .ok()?
                .flatten()
                .filter_map(|e| {
                    let version = e.file_name().to_str()?.parse().ok()?;
                    let bin = e.path().join("bin");
                    bin.join("postgres").is_file().then_some((version, bin))
                })
                .collect();
            found.sort();
            found.pop().map(|(_, dir)| dir)
        })
}

/// The user id and group id of `name`.
fn user_ids(name: &str) -> Result<(u32, u32), String> {
    let c_name =
        std::ffi::CString::new(name).map_err(|_| format!("pg_user {name:?}: not a user name"))?;
    // SAFETY: a NUL-terminated name; the entry is read at once, before any other call that
    // could reuse its static storage (the snapshot task looks a user up only here).
    let entry = unsafe { libc::getpwnam(c_name.as_ptr()) };
    if entry.is_null() {
        return Err(format!("pg_user {name:?}: no such user"));
    }
    // SAFETY: non-null, as checked.
    let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
    if uid == 0 {
        return Err(format!(
            "pg_user {name:?} is root, which PostgreSQL refuses"
        ));
    }
    Ok((uid, gid))
}

/// Makes an unpacked archive that would start as a standby promoting itself (on a trigger file
/// it holds) recover as an archive recovery instead: one that stops at its recovery target, or
/// fails if the WAL ends before it, rather than waiting for more or promoting.
fn as_archive_recovery(dir: &Path) -> io::Result<()> {
    // Written first: one of the two signal files is there throughout.
    fs::write(dir.join("recovery.signal"), b"")?;
    for name in ["standby.signal", crate::datadir::PROMOTE_TRIGGER_FILE] {
        match fs::remove_file(dir.join(name)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// Makes `dir` (removed first if there) a directory PostgreSQL accepts as its data directory,
/// and gives everything in it to the replay's user.
pub fn prepare_dir(dir: &Path) -> io::Result<()> {
    remove_dir(dir)?;
    fs::create_dir(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

/// Removes `dir` and what it holds, if it is there.
pub fn remove_dir(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Gives `path` and all under it to `uid` and `gid`; what is theirs already is left as it is,
/// so that its change time says the replay did not write it (`replayed_files::relation_file_stamps`).
fn chown_all(path: &Path, (uid, gid): (u32, u32)) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let metadata = fs::symlink_metadata(path)?;
    if (metadata.uid(), metadata.gid()) != (uid, gid) {
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
    }
    if metadata.is_dir() {
        for entry in fs::read_dir(path)? {
            chown_all(&entry?.path(), (uid, gid))?;
        }
    }
    Ok(())
}

/// Why a replay gave nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReplayRunError {
    #[error("cancelled")]
    Cancelled,
    #[error("{0}")]
    Failed(String),
}

/// Runs PostgreSQL on `dir` (a basebackup whose WAL holds a record at `target`) until it shuts
/// down right before `target`, after the checkpoint record at `checkpoint`; checks that it
/// did. It has `max_prepared_xacts` slots for prepared transactions (as many as the primary
/// has: its `pg_control`'s, or more if its WAL raised them since). `cancel` is asked every
/// 100 ms. An error quotes the end of PostgreSQL's log.
pub fn replay_to(
    programs: &PgPrograms,
    dir: &Path,
    checkpoint: Lsn,
    target: Lsn,
    max_prepared_xacts: u32,
    timeout: Duration,
    cancel: &dyn Fn() -> bool,
) -> Result<ControlFile, ReplayRunError> {
    let failed = |what: String| ReplayRunError::Failed(what);
    // A private directory for its socket (one it must have; no TCP port is opened) and its log.
    let socket_dir = SocketDir::create().map_err(|e| failed(format!("a socket directory: {e}")))?;
    let log = &socket_dir.path().join("postgres.log");
    let config = socket_dir.path();
    write_config(config).map_err(|e| failed(format!("its configuration files: {e}")))?;
    as_archive_recovery(dir).map_err(|e| failed(format!("its recovery signal files: {e}")))?;
    if let Some(ids) = programs.run_as {
        chown_all(dir, ids).map_err(|e| failed(format!("giving the directory to pg_user: {e}")))?;
        chown_all(socket_dir.path(), ids)
            .map_err(|e| failed(format!("giving the socket directory to pg_user: {e}")))?;
    }
    let log_file = fs::File::create(log).map_err(|e| failed(format!("{}: {e}", log.display())))?;
    let mut command = Command::new(programs.bin_dir.join("postgres"));
    command.arg("-D").arg(dir);
    for setting in [
        format!("recovery_target_lsn={target}"),
        "recovery_target_inclusive=off".to_owned(),
        "recovery_target_action=shutdown".to_owned(),
        "hot_standby=off".to_owned(),
        "primary_conninfo=".to_owned(),
        "archive_mode=off".to_owned(),
        "fsync=off".to_owned(),
        "listen_addresses=".to_owned(),
        format!("unix_socket_directories={}", socket_dir.path().display()),
        "logging_collector=off".to_owned(),
        "log_destination=stderr".to_owned(),
        // Configuration files of its own (`write_config`): the primary's may not be in its
        // data directory (Debian keeps them in /etc/postgresql), and what they size for the
        // primary's host has no business here. Only postgresql.auto.conf is still read from
        // the directory (PostgreSQL always does); the command line outranks it.
        format!("config_file={}", config.join(CONFIG_FILE).display()),
        format!("hba_file={}", config.join(HBA_FILE).display()),
        format!("ident_file={}", config.join(IDENT_FILE).display()),
        "shared_buffers=128MB".to_owned(),
        // Replaying a PREPARE TRANSACTION needs a free slot.
        format!("max_prepared_transactions={max_prepared_xacts}"),
        // What the primary's ALTER SYSTEM settings (postgresql.auto.conf) could hold that
        // would stop or slow this replay here: a delay, libraries, TLS files and huge pages of
        // its host. (Another recovery target there stops the replay with an error saying so:
        // PostgreSQL takes an empty one given here as a second target too.)
        "recovery_min_apply_delay=0".to_owned(),
        "shared_preload_libraries=".to_owned(),
        "ssl=off".to_owned(),
        "huge_pages=off".to_owned(),
    ] {
        command.arg("-c").arg(setting);
    }
    command
        .env_remove("PGDATA")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file);
    if let Some((uid, gid)) = programs.run_as {
        command.uid(uid).gid(gid);
    }
    // SAFETY: prctl is async-signal-safe. A server killed with `kill -9` takes the replay
    // with it (SIGQUIT: PostgreSQL's immediate shutdown) rather than leaving it running. Set
    // after the user change, which would clear it.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT);
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(|e| {
        failed(format!(
            "starting {}: {e}",
            programs.bin_dir.join("postgres").display()
        ))
    })?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => return Err(failed(format!("waiting for postgres: {e}"))),
        }
        let stop = if cancel() {
            Some(ReplayRunError::Cancelled)
        } else if started.elapsed() > timeout {
            Some(failed(format!(
                "the replay took longer than {timeout:?}: stopped"
            )))
        } else {
            None
        };
        if let Some(e) = stop {
            // SAFETY: signalling our own child, which has not been reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGQUIT) };
            let _ = child.wait();
            return Err(e);
        }
        std::thread::sleep(POLL);
    };
    let control = fs::read(dir.join(pg_control::PG_CONTROL_PATH))
        .map_err(|e| failed(format!("reading its pg_control: {e}")))
        .and_then(|b| pg_control::parse(&b).map_err(|e| failed(format!("its pg_control: {e}"))))
        .map_err(|e| {
            failed(format!(
                "PostgreSQL exited with {status} ({e}); its log: {}",
                log_tail(log)
            ))
        })?;
    if control.state != DB_SHUTDOWNED_IN_RECOVERY
        || control.checkpoint != checkpoint
        || control.min_recovery_point > target
    {
        return Err(failed(format!(
            "PostgreSQL exited with {status}, {} with its restartpoint at {} and its minimum \
             recovery point at {}, not shut down in recovery at the checkpoint record at \
             {checkpoint} (before {target}); its log: {}",
            control.state_name(),
            control.checkpoint,
            control.min_recovery_point,
            log_tail(log)
        )));
    }
    Ok(control)
}

const CONFIG_FILE: &str = "postgresql.conf";
const HBA_FILE: &str = "pg_hba.conf";
const IDENT_FILE: &str = "pg_ident.conf";

/// The replay's configuration files, in `dir`: its settings are all on its command line, and
/// it takes no connection (PostgreSQL refuses to start without an authentication rule: one
/// that rejects every local connection).
fn write_config(dir: &Path) -> io::Result<()> {
    fs::write(
        dir.join(CONFIG_FILE),
        "# A background snapshot's replay: its settings are on its command line.\n",
    )?;
    fs::write(dir.join(HBA_FILE), "local all all reject\n")?;
    fs::write(dir.join(IDENT_FILE), "")
}

/// A directory of our own under the system's temporary directory (a socket's path must be
/// short), removed when dropped.
struct SocketDir(PathBuf);

impl SocketDir {
    fn create() -> io::Result<SocketDir> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("pageserver-replay-{}-{n}", std::process::id()));
        remove_dir(&path)?;
        fs::create_dir(&path)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o700))?;
        Ok(SocketDir(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        let _ = remove_dir(&self.0);
    }
}

/// The last lines of the replay's log, for an error message.
fn log_tail(log: &Path) -> String {
    let text = fs::read(log).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// Puts into the unpacked `dir`'s `pg_wal/` (the WAL up to the end of the record at
/// `last_start`, zeros after) the records that stop its replay before `next` (where the
/// record after that one starts in the timeline's WAL) with a restartpoint there: an online
/// checkpoint record at `next` holding `checkpoint` (its timeline made the WAL's), and a no-op
/// record after it, which the replay stops before. Returns where that one starts: the
/// replay's target.
pub fn stop_before(
    dir: &Path,
    last_start: Lsn,
    next: Lsn,
    checkpoint: &Checkpoint,
    segment_size: u32,
) -> Result<Lsn, String> {
    let wal = dir.join("pg_wal");
    let size = u64::from(segment_size);
    // The segment files there, by number (under the newest timeline, if two).
    let mut files = std::collections::BTreeMap::new();
    for file in
        segment_files_in(&wal, segment_size).map_err(|e| format!("{}: {e}", wal.display()))?
    {
        if !file.partial {
            let newest = files
                .get(&file.segment.segno)
                .is_none_or(|(tli, _)| *tli < file.segment.tli);
            if newest {
                files.insert(file.segment.segno, (file.segment.tli, file.path));
            }
        }
    }
    let read_header = |path: &Path, page: Lsn| -> Option<PageHeader> {
        let file = fs::File::open(path).ok()?;
        let mut buf = [0; LONG_HEADER_LEN];
        file.read_exact_at(&mut buf, page.0 % size).ok()?;
        PageHeader::decode(&buf, page, segment_size, XLOG_PAGE_MAGIC).ok()
    };
    let (_, last_path) = files
        .get(&segno_of(last_start, segment_size))
        .ok_or_else(|| format!("no WAL segment holds {last_start}"))?;
    // The timeline is that of the page the last record starts on (a segment where the
    // timeline switched begins on the one before); the long header of its segment's first
    // page has the system identifier a next segment's needs.
    let page_of = |lsn: Lsn| Lsn(lsn.0 - lsn.0 % XLOG_BLCKSZ as u64);
    let tli = read_header(last_path, page_of(last_start))
        .ok_or_else(|| {
            format!(
                "the WAL page at {} has no valid header",
                page_of(last_start)
            )
        })?
        .tli;
    let segment_page = Lsn(last_start.0 - last_start.0 % size);
    let template = read_header(last_path, segment_page)
        .ok_or_else(|| format!("the WAL page at {segment_page} has no valid header"))?;
    let template = PageHeader { tli, ..template };
    let path_of = |lsn: Lsn| match files.get(&segno_of(lsn, segment_size)) {
        Some((_, path)) => path.clone(),
        None => wal.join(SegmentName::of(tli, lsn, segment_size).file_name(segment_size)),
    };
    let checkpoint = Checkpoint {
        tli,
        prev_tli: tli,
        ..*checkpoint
    };
    let record = checkpoint_record(last_start, &checkpoint);
    let noop_at = next_record_start(record_end(next, record.len(), segment_size), segment_size);
    let noop = encode_record(next, RM_XLOG_ID, XLOG_NOOP, 0, &[]);
    let header_of = |page: Lsn| Ok(read_header(&path_of(page), page).unwrap_or(template));
    let mut writes = place_record(next, &record, segment_size, header_of)?;
    writes.extend(place_record(noop_at, &noop, segment_size, header_of)?);
    for (lsn, bytes) in writes {
        let path = path_of(lsn);
        let file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .and_then(|f| {
                if f.metadata()?.len() < size {
                    f.set_len(size)?;
                }
                Ok(f)
            })
            .and_then(|f| f.write_all_at(&bytes, lsn.0 % size))
            .map_err(|e| format!("{}: {e}", path.display()));
        file?;
    }
    Ok(noop_at)
}

/// Makes the shut-down `dir` a snapshot: removes recovery's files, the settings the
/// basebackup added, and `pg_wal/`'s segments (a restore gets its WAL from the timeline's).
pub fn finish_dir(dir: &Path, segment_size: u32) -> io::Result<()> {
    for name in RECOVERY_FILES {
        match fs::remove_file(dir.join(name)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    let conf_path = dir.join(AUTO_CONF);
    if let Ok(conf) = fs::read(&conf_path) {
        let marker = ADDED_SETTINGS.as_bytes();
        let added = conf.windows(marker.len()).rposition(|w| w == marker);
        if let Some(added) = added {
            let file = fs::OpenOptions::new().write(true).open(&conf_path)?;
            file.set_len(added as u64)?;
        }
    }
    for file in segment_files_in(&dir.join("pg_wal"), segment_size)? {
        fs::remove_file(file.path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use postgres_wal::record::RECORD_HEADER_LEN;

    /// A shut-down directory as a replay leaves it: five 1 MiB segments, a history file,
    /// recovery's signal file and the settings the basebackup added.
    fn replayed_dir(size: u32) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("pg_wal");
        fs::create_dir(&wal).unwrap();
        for seg in 1..=5u64 {
            fs::write(
                wal.join(format!("00000001000000000000000{seg}")),
                vec![7u8; size as usize],
            )
            .unwrap();
        }
        fs::write(
            wal.join("00000002.history"),
            b"1\t0/1000000\tno recovery target\n",
        )
        .unwrap();
        fs::write(dir.path().join("recovery.signal"), b"").unwrap();
        fs::write(
            dir.path().join(AUTO_CONF),
            format!(
                "work_mem = '8MB'\n{ADDED_SETTINGS}, which ends at …\nrestore_command = 'false'\n"
            ),
        )
        .unwrap();
        dir
    }

    fn wal_left(dir: &Path) -> Vec<String> {
        let mut left: Vec<String> = fs::read_dir(dir.join("pg_wal"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        left
    }

    fn assert_no_recovery_setting(dir: &Path) {
        assert!(!dir.join("recovery.signal").exists());
        assert_eq!(
            fs::read_to_string(dir.join(AUTO_CONF)).unwrap(),
            "work_mem = '8MB'\n"
        );
    }

    #[test]
    fn the_finished_directory_keeps_no_segment_the_timeline_gives_them() {
        let size: u32 = 1 << 20;
        let dir = replayed_dir(size);
        finish_dir(dir.path(), size).unwrap();
        assert_eq!(wal_left(dir.path()), ["00000002.history"]);
        assert_no_recovery_setting(dir.path());
    }

    /// A `pg_wal/` holding a segment (1 MiB) of WAL whose last record ends `short_of` bytes
    /// before the segment's end or a page's (zeros after it, as a basebackup cuts it): the
    /// directory, that record's start and end, and the WAL's records.
    fn cut_wal(
        short_of: usize,
        at_segment_end: bool,
    ) -> (
        tempfile::TempDir,
        Lsn,
        Lsn,
        Vec<postgres_wal::DecodedRecord>,
    ) {
        use postgres_wal::synthetic::WalBuilder;
        let size: u32 = 1 << 20;
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("pg_wal")).unwrap();
        let start = Lsn(u64::from(size));
        let mut wal = WalBuilder::new(start, size);
        let boundary = if at_segment_end {
            2 * u64::from(size)
        } else {
            start.0 + 3 * XLOG_BLCKSZ as u64
        };
        // Big records to near the boundary, then one that ends `short_of` before it.
        while boundary - wal.end().0 > 3 * XLOG_BLCKSZ as u64 {
            wal.main_data_record(RM_XLOG_ID, 0x30, 0, &vec![1; 6000]);
        }
        loop {
            let left = boundary - wal.next_record_start().0;
            // What a record of `n` bytes of main data takes (header, short data header).
            let room = left as usize - short_of;
            if room <= 2 * XLOG_BLCKSZ {
                let page_left = XLOG_BLCKSZ as u64 - wal.next_record_start().0 % XLOG_BLCKSZ as u64;
                let mut main = room - 24 - 5;
                // Across page headers on the way.
                main -= 24
                    * ((room as u64).saturating_sub(page_left)).div_ceil(XLOG_BLCKSZ as u64 - 24)
                        as usize;
                wal.main_data_record(RM_XLOG_ID, 0x30, 0, &vec![2; main]);
                break;
            }
            wal.main_data_record(RM_XLOG_ID, 0x30, 0, &vec![1; 4000]);
        }
        let mut decoder = postgres_wal::WalDecoder::new(start, size);
        decoder.feed(wal.bytes());
        let records: Vec<_> = std::iter::from_fn(|| decoder.next_record().unwrap()).collect();
        let last = records.last().unwrap();
        let mut segment = wal.segment_file();
        segment.resize(size as usize, 0);
        fs::write(dir.path().join("pg_wal/000000010000000000000001"), segment).unwrap();
        (dir, last.start, last.end, records.clone())
    }

    #[test]
    fn the_replay_stops_at_a_checkpoint_put_after_the_cut_where_the_next_record_would_start() {
        let size: u32 = 1 << 20;
        let checkpoint = Checkpoint::parse(&[0; 88]).unwrap();
        for (short_of, at_segment_end) in [
            (0, false),
            (4, false),
            (40, false),
            (0, true),
            (16, true),
            (200, true),
        ] {
            let (dir, last_start, last_end, records) = cut_wal(short_of, at_segment_end);
            let next = postgres_wal::edit::next_record_start(last_end, size);
            let stop = stop_before(dir.path(), last_start, next, &checkpoint, size).unwrap();
            // Decoded from the start again: the records, the checkpoint at `next`, the no-op.
            let mut bytes = fs::read(dir.path().join("pg_wal/000000010000000000000001")).unwrap();
            if let Ok(more) = fs::read(dir.path().join("pg_wal/000000010000000000000002")) {
                bytes.extend_from_slice(&more);
            }
            let mut decoder = postgres_wal::WalDecoder::new(Lsn(u64::from(size)), size);
            decoder.feed(&bytes);
            let mut after = Vec::new();
            while let Ok(Some(r)) = decoder.next_record() {
                after.push(r);
            }
            let case = format!("{short_of} {at_segment_end}");
            assert_eq!(after.len(), records.len() + 2, "{case}");
            let put = &after[records.len()];
            assert_eq!((put.start, put.header.prev), (next, last_start), "{case}");
            let stored = Checkpoint::parse(&put.bytes[RECORD_HEADER_LEN + 2..]).unwrap();
            assert_eq!((stored.tli, stored.prev_tli), (1, 1), "{case}");
            let noop = &after[records.len() + 1];
            assert_eq!(
                (noop.start, noop.header.prev, noop.header.rm_info()),
                (stop, next, XLOG_NOOP),
                "{case}"
            );
        }
    }
}
