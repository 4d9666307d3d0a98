//! The S3 client's deadlines against stores that do not answer, all on 127.0.0.1: a listener
//! that accepts connections and never reads or writes a byte (a stalled store), and a port
//! nothing listens on (an unreachable one). Every operation must end with an error within its
//! deadline, whatever the network does. (What a real S3 API server answers is tested against
//! moto in test_runner/regress/test_remote_storage.py.)

use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use bytes::Bytes;
use remote_storage::{
    Deadlines, RemoteError, RemotePath, RemoteStorage, RemoteStorageConfig, S3Config,
};

const DEADLINES: Deadlines = Deadlines {
    connect: Duration::from_millis(500),
    request: Duration::from_secs(1),
    operation: Duration::from_secs(2),
};
/// What an error may take beyond its deadline: scheduling on a busy machine.
const SLACK: Duration = Duration::from_millis(1500);

fn credentials() {
    static SET: Once = Once::new();
    // Set once, before any test of this binary builds a client (and reads them).
    SET.call_once(|| {
        std::env::set_var("AWS_ACCESS_KEY_ID", "test");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
    });
}

/// A store on 127.0.0.1 that accepts connections and never answers; they stay open until it
/// is dropped.
struct StalledStore {
    port: u16,
    held: Arc<Mutex<Vec<TcpStream>>>,
}

impl StalledStore {
    fn start() -> StalledStore {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = Arc::new(Mutex::new(Vec::new()));
        let kept = held.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                kept.lock().unwrap().push(stream);
            }
        });
        StalledStore { port, held }
    }

    fn connections(&self) -> usize {
        self.held.lock().unwrap().len()
    }
}

fn storage(port: u16) -> RemoteStorage {
    credentials();
    RemoteStorage::open(
        &RemoteStorageConfig::S3(S3Config {
            bucket: "layers".to_owned(),
            prefix: "ps".to_owned(),
            endpoint: Some(format!("http://127.0.0.1:{port}")),
            region: None,
            use_instance_metadata: false,
        }),
        DEADLINES,
    )
    .unwrap()
}

fn key(s: &str) -> RemotePath {
    RemotePath::new(s).unwrap()
}

/// Runs `op`, which must fail as `Failed` within `bound`; returns its message.
async fn fails_within<T: std::fmt::Debug>(
    bound: Duration,
    op: impl std::future::Future<Output = Result<T, RemoteError>>,
) -> String {
    let started = Instant::now();
    let outcome = op.await;
    let took = started.elapsed();
    let e = match outcome {
        Err(e @ RemoteError::Failed { .. }) => e.to_string(),
        other => panic!("expected a failure after retries, got {other:?}"),
    };
    assert!(took <= bound + SLACK, "took {took:?}, over {bound:?}: {e}");
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_on_a_stalled_store_fails_within_its_deadline() {
    let store = StalledStore::start();
    let remote = storage(store.port);
    let dir = tempfile::tempdir().unwrap();
    let k = key("tenants/t/layer");
    let e = fails_within(DEADLINES.operation, remote.get(&k)).await;
    assert!(e.contains("deadline"), "{e}");
    fails_within(
        DEADLINES.operation,
        remote.put(&k, Bytes::from_static(b"x")),
    )
    .await;
    fails_within(DEADLINES.operation, remote.list(&key("tenants"))).await;
    fails_within(DEADLINES.operation, remote.delete(&k)).await;
    fails_within(
        DEADLINES.operation,
        remote.download_to_file(&k, &dir.path().join("dest")),
    )
    .await;
    // A file of two parts: its upload starts with a request that gets no answer.
    let local = dir.path().join("layer");
    std::fs::write(&local, vec![7u8; remote_storage::PART_SIZE + 1]).unwrap();
    fails_within(DEADLINES.operation, remote.put_file(&k, &local)).await;
    // The startup check makes a single attempt, within the request deadline.
    let e = fails_within(DEADLINES.request, remote.check()).await;
    assert!(e.contains("reachable"), "{e}");
    assert!(
        store.connections() > 0,
        "the requests never reached the store"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_fails_the_check_at_once_naming_it() {
    // A port that was just free: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let remote = storage(port);
    let e = fails_within(DEADLINES.connect, remote.check()).await;
    assert!(
        e.contains(&format!("http://127.0.0.1:{port}")) && e.contains("reachable"),
        "{e}"
    );
}
