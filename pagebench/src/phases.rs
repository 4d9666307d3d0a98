//! Clients and phases: the closed-loop clients (GetPage, ingest, `/v1/status`), the measured
//! window, and the statistics of a phase.

use super::*;

/// What one exchange achieved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Done {
    /// Payload bytes: the page read, or the images ingested.
    pub(crate) bytes: u64,
    /// Pages read or records ingested.
    pub(crate) records: u64,
}

/// One timed exchange.
pub(crate) struct Exchange {
    pub(crate) started: Instant,
    pub(crate) latency: Duration,
    pub(crate) result: anyhow::Result<Done>,
}

/// Awaits `work`, timing it.
pub(crate) async fn timed<T>(work: impl Future<Output = T>) -> (Instant, Duration, T) {
    let started = Instant::now();
    let output = work.await;
    (started, started.elapsed(), output)
}

/// What a client does, one exchange at a time.
pub(crate) enum Work {
    /// The page of a random key in `[0, keys)`.
    GetPage {
        /// The page path up to the key's value.
        prefix: String,
        keys: u32,
        value_size: usize,
        rng: fastrand::Rng,
    },
    /// `GET /v1/status`.
    Status,
    /// One batch into the client's own timeline.
    Ingest(Box<IngestClient>),
}

impl Work {
    pub(crate) async fn step(&mut self, conn: &mut Connection) -> Exchange {
        match self {
            Work::GetPage {
                prefix,
                keys,
                value_size,
                rng,
            } => {
                let index = rng.u32(0..*keys);
                let path = format!("{prefix}{}", key_for(index));
                let (started, latency, response) =
                    timed(conn.exchange(Method::GET, &path, None)).await;
                let result = response.and_then(|(status, body)| {
                    check_page(index, *value_size, status, &body)?;
                    Ok(Done {
                        bytes: u64::try_from(body.len())?,
                        records: 1,
                    })
                });
                Exchange {
                    started,
                    latency,
                    result,
                }
            }
            Work::Status => {
                let (started, latency, response) =
                    timed(conn.exchange(Method::GET, "/v1/status", None)).await;
                let result = response.and_then(|(status, body)| {
                    if status != StatusCode::OK {
                        bail!("GET /v1/status: {}", describe_failure(status, &body));
                    }
                    Ok(Done {
                        bytes: u64::try_from(body.len())?,
                        records: 1,
                    })
                });
                Exchange {
                    started,
                    latency,
                    result,
                }
            }
            Work::Ingest(client) => client.step(conn).await,
        }
    }
}

/// An ingest client: its timeline and the batch it sends next.
pub(crate) struct IngestClient {
    pub(crate) timeline_path: String,
    pub(crate) ingest_path: String,
    pub(crate) keys: u32,
    pub(crate) value_size: usize,
    pub(crate) batch_size: usize,
    /// The batch to send next; `None` until the timeline's `last_record_lsn` has been read
    /// (at the start, and after a failed batch).
    pub(crate) next: Option<Batch>,
    /// Where the key cycle resumes after a failed batch.
    pub(crate) next_key: u32,
}

impl IngestClient {
    pub(crate) async fn step(&mut self, conn: &mut Connection) -> Exchange {
        let batch = match self.next.take() {
            Some(batch) => batch,
            None => match self.resume(conn).await {
                Ok(batch) => batch,
                Err(e) => {
                    return Exchange {
                        started: Instant::now(),
                        latency: Duration::ZERO,
                        result: Err(e),
                    }
                }
            },
        };
        // Encode the following batch while this one is in flight.
        let (keys, value_size, count) = (self.keys, self.value_size, self.batch_size);
        let (following_key, last_lsn) = (batch.next_key, batch.last_lsn);
        let following = tokio::task::spawn_blocking(move || {
            let first = last_lsn
                .checked_add(lsn_step(value_size))
                .context("the LSN overflowed")?;
            build_batch(first, following_key, count, keys, value_size)
        });
        let body = Some((batch.body.clone(), OCTET_STREAM));
        let (started, latency, response) =
            timed(conn.exchange(Method::POST, &self.ingest_path, body)).await;
        let result = response.and_then(|(status, body)| {
            if status != StatusCode::OK {
                bail!(
                    "ingest into {}: {}",
                    self.timeline_path,
                    describe_failure(status, &body)
                );
            }
            Ok(Done {
                bytes: batch.payload_bytes,
                records: batch.records,
            })
        });
        let following = following
            .await
            .map_err(|e| anyhow!("encoding a batch: {e}"))
            .and_then(|built| built);
        self.next = match (&result, following) {
            (Ok(_), Ok(next)) => Some(next),
            // After a failure, where the timeline stands is read again before the next batch.
            _ => None,
        };
        self.next_key = batch.next_key;
        Exchange {
            started,
            latency,
            result,
        }
    }

    /// The next batch, starting above the timeline's `last_record_lsn`.
    pub(crate) async fn resume(&mut self, conn: &mut Connection) -> anyhow::Result<Batch> {
        let last = conn.last_record_lsn(&self.timeline_path).await?;
        let first = last
            .checked_add(lsn_step(self.value_size))
            .context("the LSN overflowed")?;
        let (key, count, keys, size) = (self.next_key, self.batch_size, self.keys, self.value_size);
        tokio::task::spawn_blocking(move || build_batch(first, key, count, keys, size))
            .await
            .map_err(|e| anyhow!("encoding a batch: {e}"))?
    }
}

/// The warmup's end and the measured window's end.
#[derive(Clone, Copy)]
pub(crate) struct Window {
    pub(crate) start: Instant,
    pub(crate) end: Instant,
}

impl Window {
    /// The rates' denominator: from the window's start to the last completion, at least the
    /// window's length.
    pub(crate) fn measured(&self, last_done: Option<Instant>) -> Duration {
        last_done.map_or(self.end, |t| t.max(self.end)) - self.start
    }
}

/// Prints the first failures of a phase and counts the rest.
pub(crate) struct ErrorLog {
    pub(crate) phase: &'static str,
    pub(crate) seen: AtomicU64,
}

impl ErrorLog {
    pub(crate) fn report(&self, error: &anyhow::Error) {
        let seen = self.seen.fetch_add(1, Ordering::Relaxed);
        if seen < ERRORS_SHOWN {
            eprintln!("pagebench: {}: {error:#}", self.phase);
        } else if seen == ERRORS_SHOWN {
            eprintln!("pagebench: {}: more errors, only counted", self.phase);
        }
    }
}

pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HISTOGRAM_MAX_NS, 3).expect("valid histogram bounds")
}

/// What a phase (or one of its clients) measured.
pub(crate) struct PhaseStats {
    pub(crate) name: &'static str,
    /// Latencies of the successful exchanges in the window, in nanoseconds.
    pub(crate) histogram: Histogram<u64>,
    /// Successful exchanges in the window.
    pub(crate) requests: u64,
    /// Failed exchanges, warmup included.
    pub(crate) errors: u64,
    pub(crate) bytes: u64,
    pub(crate) records: u64,
    pub(crate) connections: u64,
    pub(crate) last_done: Option<Instant>,
    /// The rates' denominator (see [`Window::measured`]).
    pub(crate) elapsed: Duration,
}

impl PhaseStats {
    pub(crate) fn new(name: &'static str) -> PhaseStats {
        PhaseStats {
            name,
            histogram: new_histogram(),
            requests: 0,
            errors: 0,
            bytes: 0,
            records: 0,
            connections: 0,
            last_done: None,
            elapsed: Duration::ZERO,
        }
    }

    pub(crate) fn record(&mut self, started: Instant, latency: Duration, done: Done) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.histogram.saturating_record(nanos.max(1));
        self.requests += 1;
        self.bytes += done.bytes;
        self.records += done.records;
        let finished = started + latency;
        self.last_done = Some(self.last_done.map_or(finished, |t| t.max(finished)));
    }

    pub(crate) fn merge(&mut self, other: PhaseStats) -> anyhow::Result<()> {
        self.histogram
            .add(&other.histogram)
            .map_err(|e| anyhow!("merging histograms: {e:?}"))?;
        self.requests += other.requests;
        self.errors += other.errors;
        self.bytes += other.bytes;
        self.records += other.records;
        self.connections += other.connections;
        self.last_done = match (self.last_done, other.last_done) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        Ok(())
    }

    pub(crate) fn per_sec(&self, count: u64) -> f64 {
        // Precision loss irrelevant: a rate.
        count as f64 / self.elapsed.as_secs_f64()
    }

    pub(crate) fn requests_per_sec(&self) -> f64 {
        self.per_sec(self.requests)
    }

    pub(crate) fn mib_per_sec(&self) -> f64 {
        self.per_sec(self.bytes) / MIB
    }
}

/// Latency percentiles in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Latency {
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    pub(crate) max_us: f64,
}

impl Latency {
    /// Percentiles of a histogram of nanoseconds; all zero when it is empty.
    pub(crate) fn of(histogram: &Histogram<u64>) -> Latency {
        if histogram.is_empty() {
            return Latency::default();
        }
        // Precision loss irrelevant: the histogram keeps 3 significant digits.
        let us = |ns: u64| ns as f64 / 1000.0;
        Latency {
            p50_us: us(histogram.value_at_quantile(0.5)),
            p99_us: us(histogram.value_at_quantile(0.99)),
            p999_us: us(histogram.value_at_quantile(0.999)),
            max_us: us(histogram.max()),
        }
    }
}

pub(crate) async fn client_loop(
    mut conn: Connection,
    mut work: Work,
    window: Window,
    log: Arc<ErrorLog>,
) -> PhaseStats {
    let mut stats = PhaseStats::new(log.phase);
    while Instant::now() < window.end {
        let exchange = work.step(&mut conn).await;
        match exchange.result {
            Ok(done) if exchange.started >= window.start => {
                stats.record(exchange.started, exchange.latency, done)
            }
            Ok(_) => {}
            Err(e) => {
                stats.errors += 1;
                log.report(&e);
                tokio::time::sleep(ERROR_PAUSE).await;
            }
        }
    }
    stats.connections = conn.opened;
    stats
}

/// Runs one client per `works` entry through the warmup and the window.
pub(crate) async fn run_phase(
    name: &'static str,
    endpoint: &Arc<Endpoint>,
    works: Vec<Work>,
    run: &RunArgs,
) -> anyhow::Result<PhaseStats> {
    if !run.json {
        eprintln!(
            "pagebench: {name}: {} clients, {} warmup, {} measured",
            works.len(),
            humantime::format_duration(run.warmup),
            humantime::format_duration(run.duration)
        );
    }
    let log = Arc::new(ErrorLog {
        phase: name,
        seen: AtomicU64::new(0),
    });
    let start = Instant::now() + run.warmup;
    let window = Window {
        start,
        end: start + run.duration,
    };
    let clients: Vec<_> = works
        .into_iter()
        .map(|work| {
            let conn = Connection::new(endpoint.clone());
            tokio::spawn(client_loop(conn, work, window, log.clone()))
        })
        .collect();
    let mut phase = PhaseStats::new(name);
    for client in clients {
        phase.merge(client.await.context("a client failed")?)?;
    }
    phase.elapsed = window.measured(phase.last_done);
    Ok(phase)
}

pub(crate) async fn status_baseline(
    endpoint: &Arc<Endpoint>,
    run: &RunArgs,
) -> anyhow::Result<PhaseStats> {
    let works = (0..run.clients).map(|_| Work::Status).collect();
    run_phase("status", endpoint, works, run).await
}
