//! Failpoints for crash and fault tests: named places in the code where a test can inject a
//! failure, a delay or a process exit. They exist only in builds with the `testing` feature;
//! elsewhere the `fail_point!` sites compile to nothing.
//!
//! | name                    | where                                                      |
//! |-------------------------|------------------------------------------------------------|
//! | `ephemeral-write`       | before an ephemeral file writes a run of sealed blocks     |
//! | `layer-before-rename`   | a delta layer is written and fsynced, not yet renamed      |
//! | `layer-after-rename`    | a delta layer has its final name, its directory not fsynced |
//! | `image-layer-before-rename` | an image layer is written and fsynced, not yet renamed |
//! | `image-layer-after-rename` | an image layer has its final name, its directory not fsynced |
//! | `flush-before-metadata` | a flushed layer is durable, `disk_consistent_lsn` not yet stored |
//! | `metadata-before-rename` | the new manifest is fsynced as `metadata.___temp`, not renamed |
//! | `metadata-after-rename` | the new manifest is `metadata`, its directory not fsynced   |
//! | `compaction-before-manifest` | a compaction's L1 outputs are durable, its manifest not stored |
//! | `compaction-after-manifest` | a compaction's manifest is durable, the layer map unchanged |
//! | `import-before-manifest` | an import's layer files are durable under their names, its manifest not stored |
//! | `flush-loop`            | the background flush loop, before it serves each timeline  |
//! | `remote-upload-read`    | a read of a layer file being uploaded fails (`return`) or flips its first byte (`return(corrupt)`) |
//! | `remote-download-torn-write` | a write of a layer download writes half and reports it all written |
//!
//! Actions are the `fail` crate's (`return`, `sleep(100)`, `pause`, `panic`, `off`,
//! `2*return`, ...) plus `exit`, which ends the process at once with status 1, as a crash would
//! (no destructors, no flush). Set them with `PUT /v1/failpoints` or, from the start, with the
//! environment variable `FAILPOINTS="name=action;name=action"`.

/// Whether this build has failpoints.
pub const ENABLED: bool = cfg!(feature = "testing");

/// Arms failpoint `name` with `actions`.
pub fn configure(name: &str, actions: &str) -> Result<(), String> {
    if !ENABLED {
        return Err("failpoints need a build with the `testing` feature".to_owned());
    }
    if name.is_empty() {
        return Err("a failpoint needs a name".to_owned());
    }
    if actions.trim() == "exit" {
        let name = name.to_owned();
        fail::cfg_callback(name.clone(), move || {
            tracing::info!("failpoint {name}: exiting the process");
            std::process::exit(1);
        })
    } else {
        fail::cfg(name, actions)
    }
    .map_err(|e| format!("failpoint {name}: {e}"))
}

/// Arms the failpoints listed in `FAILPOINTS`, if set; returns what it armed.
pub fn configure_from_env() -> Result<Vec<String>, String> {
    let Ok(spec) = std::env::var("FAILPOINTS") else {
        return Ok(Vec::new());
    };
    let mut armed = Vec::new();
    for item in spec.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, actions) = item
            .split_once('=')
            .ok_or_else(|| format!("FAILPOINTS: `{item}` is not name=action"))?;
        configure(name.trim(), actions.trim())?;
        armed.push(item.to_owned());
    }
    Ok(armed)
}
