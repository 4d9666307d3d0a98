//! The bounds per server and per tenant, and downloads shared by the reads that need them.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use utils::TenantId;

use super::*;

const A: TenantId = TenantId::from_bytes([1; 16]);
const B: TenantId = TenantId::from_bytes([2; 16]);

#[test]
fn a_tenant_at_its_bound_leaves_the_server_to_the_others() {
    let limit = Limit::new(
        ("imports", "import"),
        ("server_setting", 3),
        ("tenant_setting", 2),
    );
    let a1 = limit.admit(A).unwrap();
    let _a2 = limit.admit(A).unwrap();
    let busy = limit.admit(A).err().expect("A is at its bound");
    assert_eq!(
        (busy.scope, busy.limit, busy.setting),
        ("for this tenant", 2, "tenant_setting")
    );
    assert_eq!(
        busy.to_string(),
        "too many imports at once for this tenant (2, the tenant_setting setting); try again shortly"
    );
    let _b1 = limit.admit(B).unwrap();
    let busy = limit.admit(B).err().expect("the server is at its bound");
    assert_eq!((busy.scope, busy.limit), ("on this server", 3));
    assert_eq!(limit.running_now(A), (3, 2));
    // A place given back is taken again.
    drop(a1);
    assert_eq!(limit.running_now(A), (2, 1));
    let _b2 = limit.admit(B).unwrap();
    assert_eq!(limit.running_now(B), (3, 2));
}

/// A download that counts its runs and waits for `gate` (a store that answers when told).
struct Slow {
    path: std::path::PathBuf,
    tenant: TenantId,
    runs: Arc<AtomicUsize>,
    gate: Arc<Barrier>,
    fail: bool,
}

impl PendingDownload for Slow {
    fn path(&self) -> &Path {
        &self.path
    }
    fn name(&self) -> String {
        self.path.display().to_string()
    }
    fn tenant_id(&self) -> TenantId {
        self.tenant
    }
    fn download(&self) -> Result<(), String> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.gate.wait();
        if self.fail {
            Err("the store said no".to_owned())
        } else {
            Ok(())
        }
    }
}

fn limits(downloads: (usize, usize)) -> AdmissionLimits {
    AdmissionLimits {
        imports: (1, 1),
        basebackups: (1, 1),
        downloads,
    }
}

#[tokio::test(flavor = "current_thread")]
async fn readers_of_one_layer_share_one_download_and_one_place() {
    let admissions = Arc::new(Admissions::new(limits((1, 1))));
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Barrier::new(2));
    let pending = |name: &str, tenant| -> Arc<dyn PendingDownload> {
        Arc::new(Slow {
            path: name.into(),
            tenant,
            runs: runs.clone(),
            gate: gate.clone(),
            fail: false,
        })
    };
    // Eight readers of layer x, on this one thread: no thread is held while they wait.
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let (admissions, p) = (admissions.clone(), pending("x", A));
            tokio::spawn(async move { admissions.download(p).await })
        })
        .collect();
    tokio::task::yield_now().await;
    while admissions.downloads.running_now(A).0 == 0 {
        tokio::task::yield_now().await;
    }
    // The one place is taken: another layer is refused, for the server and for B.
    let other = admissions.download(pending("y", B)).await;
    assert!(matches!(
        other,
        Err(DownloadError::Busy(Busy {
            scope: "on this server",
            ..
        }))
    ));
    gate.wait();
    for waiter in waiters {
        waiter.await.unwrap().unwrap();
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "one download for eight readers"
    );
    assert_eq!(admissions.downloads.running_now(A), (0, 0));
    assert!(lock(&admissions.flights).is_empty());

    // A failure reaches every reader, and the next read starts a new download.
    let failing = |name: &str| -> Arc<dyn PendingDownload> {
        Arc::new(Slow {
            path: name.into(),
            tenant: A,
            runs: runs.clone(),
            gate: gate.clone(),
            fail: true,
        })
    };
    let two: Vec<_> = (0..2)
        .map(|_| {
            let (admissions, p) = (admissions.clone(), failing("z"));
            tokio::spawn(async move { admissions.download(p).await })
        })
        .collect();
    while admissions.downloads.running_now(A).0 == 0 {
        tokio::task::yield_now().await;
    }
    gate.wait();
    for waiter in two {
        let err = waiter.await.unwrap().unwrap_err();
        assert!(err.to_string().contains("the store said no"), "{err}");
    }
    let again = tokio::spawn({
        let (admissions, p) = (admissions.clone(), pending("z", A));
        async move { admissions.download(p).await }
    });
    while admissions.downloads.running_now(A).0 == 0 {
        tokio::task::yield_now().await;
    }
    gate.wait();
    again.await.unwrap().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}
