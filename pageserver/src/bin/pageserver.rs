//! `pageserver -D <workdir> [-c key=value ...]`: the page server.
//!
//! Startup, one log line per phase with its duration (and `pageserver_startup_duration_seconds`):
//! `config` (settings; a fresh work directory gets a `pageserver.toml` of the defaults and this
//! first start's `-c` overrides), `lock` (`pageserver.pid`, held with an exclusive file lock for
//! the life of the process, so two servers never share a directory; failpoints from
//! `FAILPOINTS` come after it), `open_files`, `page_cache`, `remote_storage` (the store's client,
//! and its check of the bucket and credentials), `load_tenants`, then `http` (both listeners).
//!
//! SIGTERM or SIGINT: stop accepting requests, let those in flight finish, flush every open
//! layer, exit 0 ("shut down cleanly"), or 1 if a flush failed ("shut down with data not
//! flushed", naming the failure). A `kill -9` loses only what was above each timeline's
//! `disk_consistent_lsn`, which clients re-send.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use pageserver::config::{
    initial_config_file, open_files_limit, AuthType, LogFormat, PageServerConf, CONFIG_FILE,
};
use pageserver::grpc::{PageServiceState, Served};
use pageserver::http::server::{serve, ConnectionTimeouts};
use pageserver::http::{router, AppState};
use pageserver::page_cache::PageCache;
use pageserver::serving::auth::JwtAuth;
use pageserver::tenant::mgr::TenantManager;
use pageserver::tenant::remote_timeline_client::RemoteContext;
use remote_storage::RemoteStorage;

const LOCK_FILE: &str = "pageserver.pid";

const VERSION: &str = if pageserver::failpoints::ENABLED {
    concat!(env!("CARGO_PKG_VERSION"), " (features: testing)")
} else {
    env!("CARGO_PKG_VERSION")
};

/// The page server: ingests page versions and PostgreSQL data directories, keeps them in layer
/// files copied to remote storage, and serves GetPage@LSN over HTTP (`listen_http_addr`,
/// default 127.0.0.1:9898) and the gRPC page service (`listen_grpc_addr`, default
/// 127.0.0.1:9899). Settings: docs/http-api.md; a graceful stop: SIGINT or SIGTERM.
#[derive(Parser)]
#[command(name = "pageserver", version = VERSION)]
struct Cli {
    /// The work directory: settings, tenants and their layer files. Created if missing.
    #[arg(short = 'D', long = "workdir", default_value = ".pageserver")]
    workdir: PathBuf,
    /// Override a setting of pageserver.toml for this run, e.g. `-c listen_http_addr=0.0.0.0:9898`.
    #[arg(short = 'c', long = "config-override", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // Before logging is up, or a failure worth seeing whatever RUST_LOG says.
            eprintln!("pageserver: error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each said once: our errors already include their source in
/// their own message.
fn error_chain(e: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if message.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

/// Times one startup phase and logs it.
struct Phases {
    started: Instant,
    phase_started: Instant,
}

impl Phases {
    fn done(&mut self, phase: &str, detail: std::fmt::Arguments) {
        let took = self.phase_started.elapsed();
        pageserver::metrics::STARTUP_SECONDS
            .with_label_values(&[phase])
            .set(took.as_secs_f64());
        tracing::info!(
            phase,
            elapsed_ms = took.as_millis() as u64,
            "startup phase {phase} done in {:.1} ms: {detail}",
            took.as_secs_f64() * 1e3
        );
        self.phase_started = Instant::now();
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let mut phases = Phases {
        started: Instant::now(),
        phase_started: Instant::now(),
    };
    let workdir = &cli.workdir;
    std::fs::create_dir_all(workdir)
        .with_context(|| format!("creating work directory {}", workdir.display()))?;
    let conf = PageServerConf::load(workdir, &cli.overrides)?;
    // Only settings that work are written down.
    let initialized = init_config_file(workdir, &cli.overrides)?;
    init_logging(conf.log_format);
    pageserver::metrics::register_all(conf.wait_lsn_timeout);
    if initialized {
        tracing::info!(
            "initialized a fresh work directory {} with the default settings{}",
            workdir.display(),
            if cli.overrides.is_empty() {
                ""
            } else {
                " and this start's -c overrides"
            }
        );
    }
    phases.done(
        "config",
        format_args!("work directory {}", workdir.display()),
    );

    let _lock = lock_workdir(workdir)?;
    phases.done("lock", format_args!("holding {LOCK_FILE}"));

    if pageserver::failpoints::ENABLED {
        let armed = pageserver::failpoints::configure_from_env().map_err(anyhow::Error::msg)?;
        if !armed.is_empty() {
            tracing::info!("started with failpoints: {}", armed.join("; "));
        }
    }

    pageserver::io::virtual_file::init(conf.max_file_descriptors);
    phases.done(
        "open_files",
        format_args!(
            "at most {} files open at once{}",
            conf.max_file_descriptors,
            fd_limit_note(conf.max_file_descriptors)
        ),
    );

    let cache = Arc::new(PageCache::new(conf.page_cache_conf()).context("page_cache_size")?);
    phases.done(
        "page_cache",
        format_args!("{} pages of 8 KiB", cache.capacity_pages()),
    );

    let remote_conf = conf.remote_storage(workdir);
    let storage = RemoteStorage::open(&remote_conf, conf.remote_deadlines())
        .context("remote_storage")?
        .with_injected_failures(conf.test_remote_failures);
    let remote_description = format!("{storage:?}");
    let remote = Arc::new(
        RemoteContext::new(
            storage.clone(),
            conf.upload_queue_max_bytes,
            conf.max_local_layer_bytes,
        )
        .context("starting the remote storage runtime")?
        .with_upload_room_timeout(conf.upload_queue_wait_timeout)
        .with_wal_upload_interval(conf.wal_upload_interval),
    );
    // A bucket that is not there, credentials it refuses or a store that does not answer stop
    // the start here, saying which, rather than failing every upload later.
    remote
        .block_on(async move { storage.check().await })
        .with_context(|| format!("remote storage {remote_description}"))?;
    phases.done(
        "remote_storage",
        format_args!(
            "layers are uploaded to {remote_description}{}",
            if conf.test_remote_failures > 0 {
                format!(
                    " (test_remote_failures: each operation fails {} times first)",
                    conf.test_remote_failures
                )
            } else {
                String::new()
            }
        ),
    );

    let (tenants, report) =
        TenantManager::load_with_remote(workdir, cache.clone(), conf.timeline_conf(), Some(remote))
            .context("loading tenants")?;
    let tenants = Arc::new(tenants);
    phases.done(
        "load_tenants",
        format_args!(
            "{} tenants ({} broken), {} timelines, {} delta layers",
            report.tenants, report.broken_tenants, report.timelines, report.delta_layers
        ),
    );

    let auth = match conf.http_auth_type {
        AuthType::Trust => None,
        AuthType::NeonJWT => {
            let path = conf
                .auth_validation_public_key_path
                .as_ref()
                .expect("validated with the settings");
            let path = if path.is_relative() {
                workdir.join(path)
            } else {
                path.clone()
            };
            Some(JwtAuth::from_key_path(&path)?)
        }
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("pageserver-http")
        .build()
        .context("starting the async runtime")?;
    let listen = conf.listen_http_addr;
    let auth_enabled = auth.is_some();
    if let (Some(set), Some(limit)) = (conf.max_connections, open_files_limit()) {
        // The default never asks for more than the limit leaves; a setting may.
        let wanted = set as u64 + conf.max_file_descriptors as u64 + 64;
        if wanted > limit {
            tracing::warn!(
                "max_connections {set} with max_file_descriptors {} may need more descriptors \
                 than the process's limit of {limit}: accepting a connection can then fail",
                conf.max_file_descriptors
            );
        }
    }
    let timeouts = ConnectionTimeouts {
        header_read: conf.http_header_read_timeout,
        response_write: conf.http_response_write_timeout,
    };
    let mut conf = conf;
    // Relative to the work directory, where the server's other files are.
    let replay_dir = workdir.join(
        conf.snapshot_replay_dir
            .clone()
            .unwrap_or_else(|| "snapshot_replay".into()),
    );
    conf.snapshot_replay_dir = Some(std::path::absolute(&replay_dir).unwrap_or(replay_dir));
    let state = Arc::new(AppState::new(conf, tenants.clone(), cache, auth));
    // The WAL receivers the loaded timelines had: each connects on its own thread.
    for tenant in tenants.list_tenants() {
        for timeline in tenant.list_timelines() {
            if let Err(e) = state.receivers.resume(timeline.clone()) {
                tracing::error!(tenant = %timeline.tenant_id(), timeline = %timeline.timeline_id(),
                    "the WAL receiver's settings cannot be used, so it does not start: {e}");
            }
        }
    }
    let receivers = state.receivers.clone();
    let connections = state.connections.clone();
    // The page service shares the read path, the auth and the connection cap of the API.
    let page_service = Arc::new(PageServiceState {
        reads: state.reads.clone(),
        auth: state.auth.clone(),
        answer_limits: pageserver::grpc::budget::AnswerLimits {
            per_stream: state.conf.grpc_answer_bytes_per_stream,
            per_connection: state.conf.grpc_answer_bytes_per_connection,
        },
    });
    let listen_grpc = state.conf.listen_grpc_addr;
    let grpc_handshake_timeout = state.conf.grpc_handshake_timeout;
    let page_service = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        let bound = listener.local_addr()?;
        let grpc_listener = tokio::net::TcpListener::bind(listen_grpc)
            .await
            .with_context(|| format!("listening on {listen_grpc} (listen_grpc_addr)"))?;
        let grpc_bound = grpc_listener.local_addr()?;
        phases.done(
            "http",
            format_args!(
                "listening on http://{bound} (auth {}, at most {} connections); page service \
                 (gRPC) on {grpc_bound}",
                if auth_enabled { "on" } else { "off" },
                connections.max()
            ),
        );
        tracing::info!(
            "pageserver started in {:.1} ms",
            phases.started.elapsed().as_secs_f64() * 1e3
        );
        // One signal stops both doors.
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let stop = Arc::new(stop);
        let stop_on_failure = stop.clone();
        let reads_on_failure = tenants.clone();
        let waiting_reads = tenants.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            // Reads waiting for an LSN would hold the shutdown up to wait_lsn_timeout.
            waiting_reads.cancel_lsn_waits();
            stop.send_replace(true);
        });
        let http_stopped = stopped.clone();
        let grpc_connections = connections.clone();
        let http = serve(
            listener,
            router(state),
            connections.clone(),
            timeouts,
            async move {
                let mut stopped = http_stopped;
                let _ = stopped.wait_for(|stopping| *stopping).await;
            },
        );
        // A page service that fails stops the server, HTTP included, as a signal would.
        let grpc = async move {
            let served = pageserver::grpc::serve(
                grpc_listener,
                grpc_connections,
                grpc_handshake_timeout,
                page_service,
                stopped,
            )
            .await;
            if let Err(e) = &served {
                tracing::error!("the page service (gRPC) failed: {e}; shutting down");
                reads_on_failure.cancel_lsn_waits();
                stop_on_failure.send_replace(true);
            }
            served
        };
        let ((), grpc) = tokio::join!(http, grpc);
        anyhow::Ok(grpc)
    })?;
    let page_service_failed = page_service.is_err();
    let connections_cut_off = matches!(page_service, Ok(Served::CutOff));

    // No request is in flight any more: stop receiving WAL, then make everything durable.
    receivers.stop_all();
    let flushing = Instant::now();
    let flushed = tenants.shutdown();
    if connections_cut_off {
        // Connections the page service cut off at the end of its grace still have streams
        // open; dropping their tasks one by one would unwind HTTP/2 state for nothing (and
        // trips a debug assertion of h2). The process ends here, and every socket with it.
        std::mem::forget(runtime);
    } else {
        drop(runtime);
    }
    match flushed {
        // Flushed, but the server stopped because the page service failed (logged above).
        Ok(()) if page_service_failed => Ok(ExitCode::FAILURE),
        Ok(()) => {
            tracing::info!(
                "flushed every timeline in {:.1} ms; shut down cleanly",
                flushing.elapsed().as_secs_f64() * 1e3
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            // Not a clean shutdown: say so, and what it means for the clients.
            tracing::error!(
                "shut down with data not flushed after {:.1} ms: a timeline's final flush failed \
                 ({e}); what it ingested above its disk_consistent_lsn is lost and must be \
                 re-sent after the next start; exiting with status 1",
                flushing.elapsed().as_secs_f64() * 1e3
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Writes a settings file, the defaults with `overrides` applied, if there is none; returns
/// whether it did.
fn init_config_file(workdir: &Path, overrides: &[String]) -> anyhow::Result<bool> {
    let config = workdir.join(CONFIG_FILE);
    if config.exists() {
        return Ok(false);
    }
    std::fs::write(&config, initial_config_file(overrides)?)
        .with_context(|| format!("writing {}", config.display()))?;
    Ok(true)
}

/// Takes the work directory's lock for the life of the process.
fn lock_workdir(workdir: &Path) -> anyhow::Result<File> {
    let path = workdir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    if let Err(e) = file.try_lock() {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        anyhow::bail!(
            "another pageserver (pid {}) is using work directory {}: {} is locked ({e})",
            holder.trim(),
            workdir.display(),
            path.display()
        );
    }
    file.set_len(0)?;
    writeln!(file, "{}", std::process::id())?;
    file.sync_all()?;
    Ok(file)
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => builder.with_ansi(false).init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop the server with kill -9");
        return std::future::pending().await;
    };
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!("received {name}: stopping the HTTP server and the page service, then flushing");
}

/// What the process's descriptor limit leaves besides our files, for the startup log: the HTTP
/// connections, the log and the runtime need descriptors too.
fn fd_limit_note(max_file_descriptors: usize) -> String {
    match open_files_limit() {
        Some(limit) if limit <= max_file_descriptors as u64 + 64 => {
            tracing::warn!(
                "max_file_descriptors {max_file_descriptors} leaves too few of the process's \
                 limit of {limit} open files for connections: raise the limit or lower the setting"
            );
            format!(" (of {limit} the process may open)")
        }
        Some(limit) => format!(" (of {limit} the process may open)"),
        None => String::new(),
    }
}
