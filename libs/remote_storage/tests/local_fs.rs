//! The interface against the local directory backend: real files, real fsync.

use std::time::Duration;

use bytes::Bytes;
use remote_storage::{RemoteError, RemotePath, RemoteStorage, RemoteStorageConfig, RetryPolicy};

fn storage(dir: &std::path::Path) -> RemoteStorage {
    RemoteStorage::new(&RemoteStorageConfig::local_dir(dir.join("remote"))).unwrap()
}

/// The same, with `hard_links = true`.
fn linking_storage(dir: &std::path::Path) -> RemoteStorage {
    RemoteStorage::new(&RemoteStorageConfig::LocalFs {
        local_path: dir.join("remote"),
        hard_links: true,
    })
    .unwrap()
}

fn key(s: &str) -> RemotePath {
    RemotePath::new(s).unwrap()
}

#[tokio::test]
async fn put_get_range_list_delete() {
    let dir = tempfile::tempdir().unwrap();
    let remote = storage(dir.path());
    let a = key("tenants/t/timelines/l/a");
    let b = key("tenants/t/timelines/l/b");
    remote
        .put(&a, Bytes::from_static(b"hello world"))
        .await
        .unwrap();
    remote.put(&b, Bytes::from_static(b"x")).await.unwrap();
    remote
        .put(&key("tenants/u/other"), Bytes::from_static(b"y"))
        .await
        .unwrap();
    assert_eq!(&remote.get(&a).await.unwrap()[..], b"hello world");
    assert_eq!(&remote.get_range(&a, 6..11).await.unwrap()[..], b"world");
    // An object is a file under the directory, under its key.
    assert_eq!(
        std::fs::read(dir.path().join("remote/tenants/t/timelines/l/a")).unwrap(),
        b"hello world"
    );
    let mut listed = remote.list(&key("tenants/t")).await.unwrap();
    listed.sort_by(|x, y| x.key.cmp(&y.key));
    let listed: Vec<(String, u64)> = listed
        .into_iter()
        .map(|o| (o.key.to_string(), o.size))
        .collect();
    assert_eq!(
        listed,
        vec![
            ("tenants/t/timelines/l/a".to_owned(), 11),
            ("tenants/t/timelines/l/b".to_owned(), 1)
        ]
    );
    remote
        .put(&a, Bytes::from_static(b"replaced"))
        .await
        .unwrap();
    assert_eq!(&remote.get(&a).await.unwrap()[..], b"replaced");
    remote.delete(&a).await.unwrap();
    remote.delete(&a).await.unwrap(); // idempotent
    assert!(matches!(
        remote.get(&a).await,
        Err(RemoteError::NotFound { .. })
    ));
    assert_eq!(remote.list(&key("tenants/t")).await.unwrap().len(), 1);
    assert!(remote.list(&key("nothing/here")).await.unwrap().is_empty());
}

#[tokio::test]
async fn create_if_absent_never_replaces() {
    let dir = tempfile::tempdir().unwrap();
    let remote = storage(dir.path());
    let k = key("index-00000001");
    assert!(remote
        .create_if_absent(&k, Bytes::from_static(b"first"))
        .await
        .unwrap());
    assert!(!remote
        .create_if_absent(&k, Bytes::from_static(b"second"))
        .await
        .unwrap());
    assert_eq!(&remote.get(&k).await.unwrap()[..], b"first");
}

#[tokio::test]
async fn files_upload_in_parts_and_download_whole() {
    let dir = tempfile::tempdir().unwrap();
    let remote = storage(dir.path());
    // Over two parts, not a multiple of the part size.
    let len = 2 * remote_storage::PART_SIZE + 12345;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    let local = dir.path().join("layer");
    std::fs::write(&local, &data).unwrap();
    let k = key("tenants/t/layer-00000001");
    let sent = remote.put_file(&k, &local).await.unwrap();
    assert_eq!(
        (sent.len, sent.crc32c),
        (len as u64, utils::crc32c::crc32c(&data))
    );
    let small = dir.path().join("small");
    std::fs::write(&small, b"abc").unwrap();
    assert_eq!(remote.put_file(&key("small"), &small).await.unwrap().len, 3);

    let dest = dir.path().join("downloaded");
    let downloaded = remote.download_to_file(&k, &dest).await.unwrap();
    assert_eq!(downloaded.len, len as u64);
    assert_eq!(downloaded.crc32c, utils::crc32c::crc32c(&data));
    assert!(std::fs::read(&dest).unwrap() == data);
    let missing = remote
        .download_to_file(&key("absent"), &dir.path().join("x"))
        .await;
    assert!(
        matches!(missing, Err(RemoteError::NotFound { .. })),
        "{missing:?}"
    );
}

#[tokio::test]
async fn injected_failures_are_retried_per_key_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let fast = RetryPolicy {
        initial: Duration::from_millis(1),
        max_backoff: Duration::from_millis(4),
        timeout: Duration::from_secs(5),
    };
    let remote = storage(dir.path())
        .with_injected_failures(3)
        .with_retry_policy(fast);
    let k = key("a");
    // Each operation fails three times, then goes through.
    remote.put(&k, Bytes::from_static(b"v")).await.unwrap();
    assert_eq!(&remote.get(&k).await.unwrap()[..], b"v");
    remote.delete(&k).await.unwrap();

    // With a time bound shorter than the backoff, the failures are returned, counted.
    let impatient = storage(dir.path())
        .with_injected_failures(100)
        .with_retry_policy(RetryPolicy {
            initial: Duration::from_millis(5),
            max_backoff: Duration::from_millis(5),
            timeout: Duration::from_millis(30),
        });
    match impatient.put(&k, Bytes::from_static(b"v")).await {
        Err(RemoteError::Failed {
            op,
            key,
            attempts,
            reason,
            ..
        }) => {
            assert_eq!((op, key.as_str()), ("put", "a"));
            assert!(attempts >= 2, "{attempts}");
            assert!(reason.contains("injected"), "{reason}");
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    // Nothing was written by the failed attempts.
    assert!(matches!(
        remote.get(&k).await,
        Err(RemoteError::NotFound { .. })
    ));
}

#[test]
fn keys_cannot_climb_out() {
    for bad in [
        "", "/a", "a/", "a//b", "../a", "a/./b", "a/../b", "a b", "a\\b", "ü",
    ] {
        assert!(RemotePath::new(bad).is_err(), "{bad:?} accepted");
    }
    let k = key("tenants/t/index_part.json-00000002");
    assert_eq!(k.file_name(), "index_part.json-00000002");
    assert_eq!(
        k.join("x").unwrap().as_str(),
        "tenants/t/index_part.json-00000002/x"
    );
}

#[test]
fn settings_parse_with_clear_errors() {
    let parse = |s: &str| -> Result<RemoteStorageConfig, String> {
        serde_json::from_str::<RemoteStorageConfig>(s).map_err(|e| e.to_string())
    };
    assert_eq!(
        parse(r#"{"local_path": "/d"}"#).unwrap(),
        RemoteStorageConfig::local_dir("/d")
    );
    let linking = RemoteStorageConfig::LocalFs {
        local_path: "/d".into(),
        hard_links: true,
    };
    assert_eq!(
        parse(r#"{"local_path": "/d", "hard_links": true}"#).unwrap(),
        linking
    );
    // Written back as read: the default left out, the other setting kept.
    for config in [RemoteStorageConfig::local_dir("/d"), linking] {
        let text = serde_json::to_string(&config).unwrap();
        assert_eq!(parse(&text).unwrap(), config, "{text}");
    }
    match parse(r#"{"bucket": "b", "prefix": "/p/q/", "endpoint": "http://127.0.0.1:9000"}"#)
        .unwrap()
    {
        RemoteStorageConfig::S3(s3) => {
            // No region: the environment's, or us-east-1, when the client is built.
            assert_eq!(
                (
                    s3.bucket.as_str(),
                    s3.prefix.as_str(),
                    s3.region,
                    s3.use_instance_metadata
                ),
                ("b", "p/q", None, false)
            );
        }
        other => panic!("{other:?}"),
    }
    for (bad, says) in [
        (r#"{}"#, "needs local_path"),
        (r#"{"local_path": "/d", "bucket": "b"}"#, "choose one"),
        (
            r#"{"local_path": "/d", "region": "r"}"#,
            "region is an S3 setting",
        ),
        (
            r#"{"bucket": "b", "endpoint": "127.0.0.1:9000"}"#,
            "not an http",
        ),
        (r#"{"bucket": "b", "prefix": "a/../b"}"#, "prefix"),
        (r#"{"bucket": "b", "bukket": "c"}"#, "unknown field"),
        (r#"{"bucket": "b", "region": ""}"#, "region is empty"),
        (
            r#"{"local_path": "/d", "use_instance_metadata": true}"#,
            "use_instance_metadata is an S3 setting",
        ),
        (
            r#"{"bucket": "b", "hard_links": true}"#,
            "hard_links is a local_path setting",
        ),
    ] {
        let err = parse(bad).unwrap_err();
        assert!(err.contains(says), "{bad}: {err}");
    }
}

/// A real file whose reads fail, or return other bytes, from a given offset on.
#[derive(Debug)]
struct FaultyReads {
    inner: remote_storage::StdFile,
    from: u64,
    /// Flip a byte instead of failing.
    lie: bool,
}

impl remote_storage::LocalFile for FaultyReads {
    fn path(&self) -> &std::path::Path {
        self.inner.path()
    }
    fn size(&self) -> std::io::Result<u64> {
        self.inner.size()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        if offset + buf.len() as u64 <= self.from {
            return self.inner.read_exact_at(buf, offset);
        }
        if !self.lie {
            return Err(std::io::Error::other("injected read failure"));
        }
        self.inner.read_exact_at(buf, offset)?;
        buf[buf.len() - 1] ^= 0x55;
        Ok(())
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_all_at(buf, offset)
    }
    fn sync_all(&self) -> std::io::Result<()> {
        self.inner.sync_all()
    }
    fn immutable_inode(&self) -> std::io::Result<Option<remote_storage::Inode>> {
        self.inner.immutable_inode()
    }
}

#[tokio::test]
async fn an_upload_whose_reads_fail_or_differ_never_replaces_the_object() {
    use remote_storage::{LocalFile, StdFile, Transferred};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    // Files declared immutable go by link, the others are copied.
    let remote = linking_storage(dir.path());
    // In one request, and in parts (past the local part size, not a multiple of it).
    for len in [1000, 2 * remote_storage::LOCAL_PART_SIZE + 777] {
        let data: Vec<u8> = (0..len).map(|i| (i * 13 % 251) as u8).collect();
        let local = dir.path().join(format!("layer-{len}"));
        std::fs::write(&local, &data).unwrap();
        let expected = Transferred {
            len: len as u64,
            crc32c: utils::crc32c::crc32c(&data),
        };
        let k = key(&format!("layer-{len}"));
        remote.put(&k, Bytes::from_static(b"old")).await.unwrap();
        // Copied, and (immutable) linked: the link is checked through the same reads.
        for immutable in [false, true] {
            let faulty = |lie| -> Arc<dyn LocalFile> {
                let open = if immutable {
                    StdFile::open_immutable
                } else {
                    StdFile::open
                };
                Arc::new(FaultyReads {
                    inner: open(&local).unwrap(),
                    from: len as u64 - 1,
                    lie,
                })
            };
            let failed = remote.upload(&k, faulty(false), Some(expected)).await;
            assert!(
                matches!(&failed, Err(RemoteError::LocalIo { source, .. }) if source.to_string().contains("injected")),
                "{failed:?}"
            );
            assert_eq!(&remote.get(&k).await.unwrap()[..], b"old");
            let lied = remote.upload(&k, faulty(true), Some(expected)).await;
            assert!(
                matches!(&lied, Err(RemoteError::LocalIo { source, .. }) if source.to_string().contains("the file should be")),
                "{lied:?}"
            );
            assert_eq!(&remote.get(&k).await.unwrap()[..], b"old");
            assert_eq!(
                staging_names(&dir.path().join("remote")),
                Vec::<String>::new()
            );
        }
        // Reads that are right: the object is the file.
        let sent = remote
            .upload(&k, Arc::new(StdFile::open(&local).unwrap()), Some(expected))
            .await;
        assert_eq!(sent.unwrap(), expected);
        assert!(remote.get(&k).await.unwrap() == data);
        // A file that shrinks under the upload, with nothing expected of it: an error, not a
        // short object.
        remote.put(&k, Bytes::from_static(b"old")).await.unwrap();
        let file = StdFile::open(&local).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&local)
            .unwrap()
            .set_len(len as u64 / 2)
            .unwrap();
        let upload = UploadOfLen(file, len as u64);
        let short = remote.upload(&k, Arc::new(upload), None).await;
        assert!(
            matches!(&short, Err(RemoteError::LocalIo { source, .. }) if source.to_string().contains("changed during the upload")),
            "{short:?}"
        );
        assert_eq!(&remote.get(&k).await.unwrap()[..], b"old");
    }
}

/// A file whose length is the one it had when the upload started: one that shrinks after.
#[derive(Debug)]
struct UploadOfLen(remote_storage::StdFile, u64);

impl remote_storage::LocalFile for UploadOfLen {
    fn path(&self) -> &std::path::Path {
        self.0.path()
    }
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.1)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn sync_all(&self) -> std::io::Result<()> {
        self.0.sync_all()
    }
}

/// Names under `root` that are not objects: staging names a failed upload left.
fn staging_names(root: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.to_string_lossy().contains('#') {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

fn inode(path: &std::path::Path) -> (u64, u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap();
    (m.dev(), m.ino(), m.nlink())
}

#[tokio::test]
async fn an_immutable_file_is_uploaded_as_a_hard_link_that_outlives_its_name() {
    use remote_storage::{StdFile, Transferred};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let linking = linking_storage(dir.path());
    let copying = storage(dir.path());
    std::fs::create_dir(dir.path().join("work")).unwrap();
    let data: Vec<u8> = (0..3 * remote_storage::LOCAL_PART_SIZE + 5)
        .map(|i| (i * 7 % 253) as u8)
        .collect();
    let expected = Transferred {
        len: data.len() as u64,
        crc32c: utils::crc32c::crc32c(&data),
    };
    let local = dir.path().join("work/layer");
    std::fs::write(&local, &data).unwrap();
    let object = |name: &str| dir.path().join("remote/t/").join(name);

    // Declared immutable, into a directory that links: the object is the file's inode, made
    // in a directory that did not exist.
    let k = key("t/linked");
    let file = Arc::new(StdFile::open_immutable(&local).unwrap());
    assert_eq!(
        linking.upload(&k, file, Some(expected)).await.unwrap(),
        expected
    );
    let (dev, ino, links) = inode(&local);
    assert_eq!(inode(&object("linked")), (dev, ino, 2));
    assert_eq!(links, 2);
    // Uploaded again (its answer lost, or after a restart): the object stays that inode, and
    // no second name is left behind.
    let file = Arc::new(StdFile::open_immutable(&local).unwrap());
    assert_eq!(
        linking.upload(&k, file, Some(expected)).await.unwrap(),
        expected
    );
    assert_eq!(inode(&object("linked")), (dev, ino, 2));
    assert_eq!(
        staging_names(&dir.path().join("remote")),
        Vec::<String>::new()
    );
    // Every other case is a copy: a file not declared immutable, a directory set to copy.
    for (name, remote, file) in [
        ("plain", &linking, StdFile::open(&local).unwrap()),
        ("copied", &copying, StdFile::open_immutable(&local).unwrap()),
    ] {
        let k = key(&format!("t/{name}"));
        let sent = remote.upload(&k, Arc::new(file), Some(expected)).await;
        assert_eq!(sent.unwrap(), expected);
        assert_ne!(inode(&object(name)).1, ino, "{name}");
    }
    // A path replaced after the file was opened: the object holds what the opened file holds,
    // copied, and is neither inode.
    let opened = Arc::new(StdFile::open_immutable(&local).unwrap());
    let replacement = dir.path().join("work/layer.tmp");
    std::fs::write(&replacement, b"another file").unwrap();
    std::fs::rename(&replacement, &local).unwrap();
    let k2 = key("t/replaced");
    assert_eq!(
        linking.upload(&k2, opened, Some(expected)).await.unwrap(),
        expected
    );
    assert!(linking.get(&k2).await.unwrap() == data);
    let (_, replaced_ino, _) = inode(&object("replaced"));
    assert!(replaced_ino != ino && replaced_ino != inode(&local).1);

    // A path removed after the file was opened (a layer retired meanwhile): copied from the
    // open file.
    let removed = dir.path().join("work/retired");
    std::fs::write(&removed, &data).unwrap();
    let opened = Arc::new(StdFile::open_immutable(&removed).unwrap());
    std::fs::remove_file(&removed).unwrap();
    let k3 = key("t/retired");
    assert_eq!(
        linking.upload(&k3, opened, Some(expected)).await.unwrap(),
        expected
    );
    assert!(linking.get(&k3).await.unwrap() == data);

    // The local name goes (an eviction): the object stays, whole, and lists as before.
    std::fs::remove_file(&local).unwrap();
    assert_eq!(inode(&object("linked")), (dev, ino, 1));
    assert!(linking.get(&k).await.unwrap() == data);
    let mut listed: Vec<_> = linking
        .list(&key("t"))
        .await
        .unwrap()
        .into_iter()
        .map(|o| (o.key.to_string(), o.size))
        .collect();
    listed.sort();
    let len = data.len() as u64;
    let names = ["copied", "linked", "plain", "replaced", "retired"];
    assert_eq!(listed, names.map(|n| (format!("t/{n}"), len)).to_vec());
    assert_eq!(
        staging_names(&dir.path().join("remote")),
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn an_upload_to_another_file_system_copies() {
    use remote_storage::{StdFile, Transferred};
    use std::sync::Arc;
    // /dev/shm is a tmpfs where it exists: another file system than the temporary directory's.
    let shm = std::path::Path::new("/dev/shm");
    let work = tempfile::tempdir().unwrap();
    let Ok(remote_dir) = tempfile::tempdir_in(shm) else {
        eprintln!("no /dev/shm here: the case is not run");
        return;
    };
    if inode(work.path()).0 == inode(remote_dir.path()).0 {
        eprintln!("/dev/shm is on the temporary directory's file system: the case is not run");
        return;
    }
    let remote = linking_storage(remote_dir.path());
    let local = work.path().join("layer");
    let data = vec![7u8; 100_000];
    std::fs::write(&local, &data).unwrap();
    let expected = Transferred {
        len: data.len() as u64,
        crc32c: utils::crc32c::crc32c(&data),
    };
    for name in ["a", "b"] {
        let file = Arc::new(StdFile::open_immutable(&local).unwrap());
        let sent = remote.upload(&key(name), file, Some(expected)).await;
        assert_eq!(sent.unwrap(), expected);
        assert!(remote.get(&key(name)).await.unwrap() == data);
    }
    assert_eq!(inode(&local).2, 1);
}
