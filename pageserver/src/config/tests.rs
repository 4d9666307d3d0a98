use super::*;
use crate::format::compression::Compression;

#[test]
fn the_default_file_says_what_the_defaults_are() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(CONFIG_FILE), DEFAULT_CONFIG_TOML).unwrap();
    assert_eq!(
        PageServerConf::load(dir.path(), &[]).unwrap(),
        PageServerConf::default()
    );
    // No file at all: the same.
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(
        PageServerConf::load(empty.path(), &[]).unwrap(),
        PageServerConf::default()
    );
}

#[test]
fn layer_compression_parses_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let load = |o: &str| PageServerConf::load(dir.path(), &[o.to_owned()]);
    assert_eq!(
        load("layer_compression=zstd")
            .unwrap()
            .timeline
            .layer_compression,
        Compression::Zstd { level: 1 }
    );
    assert_eq!(
        load("layer_compression='zstd:-2'")
            .unwrap()
            .timeline
            .layer_compression,
        Compression::Zstd { level: -2 }
    );
    let err = load("layer_compression=gzip").unwrap_err().to_string();
    assert!(err.contains("unknown compression \"gzip\""), "{err}");
    let err = load("layer_compression='zstd:99'").unwrap_err().to_string();
    assert!(err.contains("zstd level 99 is outside -7..=19"), "{err}");
}

#[test]
fn overrides_win_and_take_bare_words_as_strings() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(CONFIG_FILE),
        "checkpoint_timeout = \"1s\"\nid = 5\n",
    )
    .unwrap();
    let conf = PageServerConf::load(
        dir.path(),
        &[
            "listen_http_addr=127.0.0.1:0".into(),
            "checkpoint_distance=1048576".into(),
            "page_cache_size=\"8MiB\"".into(),
            "wait_lsn_timeout=250ms".into(),
            "log_format=json".into(),
            "scan_cursor_cache_size=1MiB".into(),
            "scan_cursor_idle_timeout=2s".into(),
        ],
    )
    .unwrap();
    assert_eq!(conf.id, 5);
    assert_eq!(conf.timeline.checkpoint_timeout, Duration::from_secs(1));
    assert_eq!(conf.listen_http_addr.port(), 0);
    assert_eq!(conf.timeline.checkpoint_distance, 1 << 20);
    assert_eq!(conf.page_cache_size, 8 << 20);
    assert_eq!(conf.wait_lsn_timeout, Duration::from_millis(250));
    assert_eq!(conf.log_format, LogFormat::Json);
    assert_eq!(conf.scan_cursor_cache_size, 1 << 20);
    assert_eq!(conf.scan_cursor_idle_timeout, Duration::from_secs(2));
}

#[test]
fn mistakes_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = |overrides: &[&str]| {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        PageServerConf::load(dir.path(), &overrides)
            .unwrap_err()
            .to_string()
    };
    assert!(err(&["chekpoint_distance=1"]).contains("unknown field `chekpoint_distance`"));
    // Every unknown key is named, beside a timeline's setting and a server's that are right.
    let both = err(&[
        "gc_horizon=1MiB",
        "bogus=1",
        "id=3",
        "compaction_treshold=2",
    ]);
    assert!(
        both.contains("unknown field `bogus`, unknown field `compaction_treshold`"),
        "{both}"
    );
    // A timeline's setting of the wrong type says what is wrong with it.
    assert!(err(&["gc_horizon=\"lots\""]).contains("`lots` is not a size"));
    assert!(err(&["max_frozen_layers=\"two\""]).contains("invalid type"));
    assert!(err(&["checkpoint_distance"]).contains("expected key=value"));
    assert!(err(&["checkpoint_distance=12parsecs"]).contains("unknown size unit"));
    assert!(err(&["checkpoint_timeout=soon"]).contains("not a duration"));
    assert!(err(&["listen_http_addr=nowhere"]).contains("invalid socket address"));
    assert!(err(&["max_concurrent_imports_per_tenant=0"]).contains(
        "max_concurrent_imports_per_tenant = 0 is out of range: it must be from 1 to 1024"
    ));
    assert!(err(&["listen_grpc_addr=127.0.0.1:9898"]).contains("an address of its own"));
    // Port 0 (any free port) may be asked for twice.
    let both_any = [
        "listen_http_addr=127.0.0.1:0",
        "listen_grpc_addr=127.0.0.1:0",
    ];
    let both_any: Vec<String> = both_any.iter().map(|s| s.to_string()).collect();
    assert!(PageServerConf::load(dir.path(), &both_any).is_ok());
    assert!(err(&["http_auth_type=NeonJWT"]).contains("auth_validation_public_key_path"));
    assert!(err(&["max_value_size=100"]).contains("smaller than a page"));
    assert!(err(&["page_cache_index_percent=101"]).contains("above 100"));
    assert!(err(&["scan_cursor_idle_timeout=0s"]).contains("above zero"));
    assert!(err(&["scan_cursor_cache_size=lots"]).contains("not a size"));
    assert!(err(&["checkpoint_distance=2TB"]).contains("out of range"));
    std::fs::write(dir.path().join(CONFIG_FILE), "id = [").unwrap();
    assert!(err(&[]).contains(CONFIG_FILE));
}

#[test]
fn http_limits_refuse_nonsense() {
    let dir = tempfile::tempdir().unwrap();
    let load = |overrides: &[&str]| {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        PageServerConf::load(dir.path(), &overrides)
    };
    let err = |overrides: &[&str]| load(overrides).unwrap_err().to_string();
    assert!(err(&["http_header_read_timeout=0s"])
        .contains("http_header_read_timeout must be above zero"));
    assert!(
        err(&["http_body_read_timeout=0ms"]).contains("http_body_read_timeout must be above zero")
    );
    assert!(err(&["http_response_write_timeout=0s"])
        .contains("http_response_write_timeout must be above zero"));
    assert!(
        err(&["grpc_handshake_timeout=0s"]).contains("grpc_handshake_timeout must be above zero")
    );
    assert!(err(&["grpc_answer_bytes_per_stream=0"]).contains(
        "grpc_answer_bytes_per_stream = 0B is out of range: it must be from 8KiB to 16GiB"
    ));
    assert!(err(&["grpc_answer_bytes_per_connection=8MiB"]).contains(
        "grpc_answer_bytes_per_connection = 8MiB is out of range: it must be from 16MiB to 16GiB"
    ));
    assert!(err(&["max_connections=0"]).contains("from 1 to"));
    assert!(err(&["max_connections=99999999"]).contains("from 1 to"));
    assert!(err(&["max_buffered_request_bytes=1MiB"]).contains("below max_request_body_size"));
    let conf = load(&[
        "http_header_read_timeout=250ms",
        "http_body_read_timeout=2s",
        "http_response_write_timeout=3s",
        "grpc_handshake_timeout=4s",
        "grpc_answer_bytes_per_stream=1MiB",
        "grpc_answer_bytes_per_connection=2MiB",
        "max_connections=3",
        "max_buffered_request_bytes=1MiB",
        "max_request_body_size=1MiB",
    ])
    .unwrap();
    assert_eq!(conf.http_header_read_timeout, Duration::from_millis(250));
    assert_eq!(conf.http_body_read_timeout, Duration::from_secs(2));
    assert_eq!(conf.http_response_write_timeout, Duration::from_secs(3));
    assert_eq!(conf.grpc_handshake_timeout, Duration::from_secs(4));
    assert_eq!(conf.grpc_answer_bytes_per_stream, 1 << 20);
    assert_eq!(conf.grpc_answer_bytes_per_connection, 2 << 20);
    assert_eq!(conf.max_connections(), 3);
    assert_eq!(conf.max_buffered_request_bytes, 1 << 20);
}

#[test]
fn the_connection_cap_leaves_descriptors_for_files() {
    // The usual 1024: 512 for files, 64 kept, the rest for connections.
    assert_eq!(default_max_connections(Some(1024), 512), 448);
    assert_eq!(default_max_connections(Some(1 << 20), 512), 1000);
    assert_eq!(default_max_connections(Some(128), 32), 32);
    assert_eq!(default_max_connections(Some(100), 512), 16);
    assert_eq!(default_max_connections(None, 512), 1000);
    let conf = PageServerConf::default();
    let expected = default_max_connections(open_files_limit(), conf.max_file_descriptors);
    assert_eq!(conf.max_connections(), expected);
}

#[test]
fn the_open_file_limit_is_read_from_proc() {
    let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                  Max open files            20000                40000                files     \n";
    assert_eq!(parse_open_files_limit(limits), Some(20000));
    let unlimited = "Max open files            unlimited            unlimited            files\n";
    assert_eq!(parse_open_files_limit(unlimited), None);
    assert!(open_files_limit().is_some_and(|n| n > 0));
}

#[test]
fn values_that_break_the_server_are_refused_with_their_range() {
    let dir = tempfile::tempdir().unwrap();
    let load = |overrides: &[&str]| {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        PageServerConf::load(dir.path(), &overrides)
    };
    let cases = [
        (
            "max_request_body_size=0",
            "max_request_body_size = 0B is out of range: it must be from 8223B to 4GiB",
        ),
        (
            "checkpoint_distance=0",
            "checkpoint_distance = 0B is out of range: it must be from 8KiB to 1TiB",
        ),
        (
            "max_frozen_layers=0",
            "max_frozen_layers = 0 is out of range: it must be from 1 to 1000",
        ),
        (
            "wait_lsn_timeout=0s",
            "wait_lsn_timeout = 0s is out of range: it must be from 1ms to 1day",
        ),
        (
            "materialized_versions_per_key=9",
            "materialized_versions_per_key = 9 is out of range: it must be from 0 to 8",
        ),
        (
            "compaction_threshold=1",
            "compaction_threshold = 1 is out of range: it must be from 2 to 32",
        ),
        (
            "l0_slowdown_threshold=3",
            "l0_slowdown_threshold = 3 is out of range: it must be from 4 to 1000",
        ),
        (
            "l0_stop_threshold=7",
            "l0_stop_threshold = 7 is out of range: it must be from 8 to 1000",
        ),
        (
            "remote_storage_connect_timeout=0s",
            "remote_storage_connect_timeout = 0s is out of range: it must be from 10ms to 1h",
        ),
        (
            "upload_queue_wait_timeout=2h",
            "upload_queue_wait_timeout = 2h is out of range: it must be from 10ms to 1h",
        ),
        (
            "remote_storage_operation_timeout=10s",
            "remote_storage_operation_timeout = 10s is out of range: it must be from 30s to 1h",
        ),
    ];
    for (setting, message) in cases {
        let e = load(&[setting]).unwrap_err().to_string();
        assert_eq!(e, format!("settings: {message}"), "{setting}");
    }
    // The ends of each range are allowed.
    let conf = load(&[
        "max_request_body_size=8223",
        "checkpoint_distance=\"8KiB\"",
        "max_frozen_layers=1",
        "wait_lsn_timeout=1ms",
        "materialized_versions_per_key=0",
        "compaction_threshold=0",
    ])
    .unwrap();
    assert_eq!(conf.page_cache_conf().materialized_versions_per_key, 0);
    assert_eq!(conf.timeline_conf().compaction_threshold, 0);
    let conf = load(&[
        "max_request_body_size=4GiB",
        "max_buffered_request_bytes=4GiB",
        "checkpoint_distance=1TiB",
        "max_frozen_layers=1000",
        "wait_lsn_timeout=1day",
        "materialized_versions_per_key=8",
    ])
    .unwrap();
    assert_eq!(conf.timeline.checkpoint_distance, 1 << 40);
    assert_eq!(conf.page_cache_conf().materialized_versions_per_key, 8);
}

#[test]
fn the_first_file_records_the_first_starts_overrides() {
    assert_eq!(initial_config_file(&[]).unwrap(), DEFAULT_CONFIG_TOML);
    let overrides: Vec<String> = [
        "id=7",
        "listen_http_addr=127.0.0.1:0",
        "page_cache_size=\"16MiB\"",
        "checkpoint_timeout=1s",
        "auth_validation_public_key_path=key.pem",
        "id=8",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let text = initial_config_file(&overrides).unwrap();
    assert!(
        text.contains("\nid = 8 # set with -c at the first start\n"),
        "{text}"
    );
    assert!(text.contains("\n# The largest page image or reconstructed page.\n"));
    assert!(!text.contains("# auth_validation_public_key_path"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(CONFIG_FILE), &text).unwrap();
    let recorded = PageServerConf::load(dir.path(), &[]).unwrap();
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(
        recorded,
        PageServerConf::load(empty.path(), &overrides).unwrap()
    );
    assert_eq!(recorded.id, 8);
    assert_eq!(recorded.page_cache_size, 16 << 20);
    assert_eq!(
        recorded.auth_validation_public_key_path,
        Some(PathBuf::from("key.pem"))
    );
}

#[test]
fn remote_storage_is_a_directory_in_the_workdir_unless_set() {
    let dir = tempfile::tempdir().unwrap();
    let workdir = dir.path();
    let local = |path: &Path| RemoteStorageConfig::local_dir(path.to_owned());
    let conf = PageServerConf::load(workdir, &[]).unwrap();
    assert_eq!(conf.remote_storage(workdir), local(&workdir.join("remote")));
    let conf =
        PageServerConf::load(workdir, &["remote_storage={local_path=\"shared\"}".into()]).unwrap();
    assert_eq!(conf.remote_storage(workdir), local(&workdir.join("shared")));
    let conf =
        PageServerConf::load(workdir, &["remote_storage={local_path=\"/abs\"}".into()]).unwrap();
    assert_eq!(conf.remote_storage(workdir), local(Path::new("/abs")));
    let linked = "remote_storage={local_path=\"shared\", hard_links=true}";
    let conf = PageServerConf::load(workdir, &[linked.into()]).unwrap();
    assert_eq!(
        conf.remote_storage(workdir),
        RemoteStorageConfig::LocalFs {
            local_path: workdir.join("shared"),
            hard_links: true
        }
    );
    let conf = PageServerConf::load(
        workdir,
        &[
            "remote_storage={bucket=\"b\", prefix=\"p\", endpoint=\"http://127.0.0.1:9000\"}"
                .into(),
            "upload_queue_max_bytes=\"256MiB\"".into(),
            "test_remote_failures=2".into(),
        ],
    )
    .unwrap();
    match conf.remote_storage(workdir) {
        RemoteStorageConfig::S3(s3) => {
            assert_eq!(s3.bucket, "b");
            assert_eq!(s3.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        (conf.upload_queue_max_bytes, conf.test_remote_failures),
        (256 << 20, 2)
    );
    // The deadlines, each set apart.
    let conf = PageServerConf::load(
        workdir,
        &[
            "remote_storage_connect_timeout=\"1s\"".into(),
            "remote_storage_request_timeout=\"2s\"".into(),
            "remote_storage_operation_timeout=\"3s\"".into(),
            "upload_queue_wait_timeout=\"4s\"".into(),
        ],
    )
    .unwrap();
    let deadlines = conf.remote_deadlines();
    assert_eq!(
        (
            deadlines.connect,
            deadlines.request,
            deadlines.operation,
            conf.upload_queue_wait_timeout
        ),
        (
            Duration::from_secs(1),
            Duration::from_secs(2),
            Duration::from_secs(3),
            Duration::from_secs(4)
        )
    );
    let e = PageServerConf::load(
        workdir,
        &["remote_storage={bucket=\"b\", local_path=\"/x\"}".into()],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("choose one"), "{e}");
}
