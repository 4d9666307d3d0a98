//! Workload descriptions and their op streams: sizes, deterministic randomness, page stamps,
//! the scenarios and the streams generated from a seed.

use pageserver::page_cache::MaterializedPageKey;
use pageserver::PAGE_SZ;
use pageserver_api::Key;
use utils::{Lsn, TenantId, TimelineId};

pub(crate) type Page = [u8; PAGE_SZ];

/// Pages every cache holds.
pub(crate) const CAPACITY: usize = 8192;
/// Resident / hot keys for hit_path, scan_pollution and prewarm_read.
pub(crate) const HOT_KEYS: u32 = 4096;
/// cache_bench_mix key space: 4x capacity.
pub(crate) const MIX_KEYS: u32 = 4 * CAPACITY as u32;
/// Handles held at once in cache_bench_mix: a quarter of the capacity.
const MIX_HELD: usize = CAPACITY / 4;
/// prewarm_read reads back a block written between 1 and this many inserts earlier.
pub(crate) const PREWARM_MAX_DISTANCE: u32 = (CAPACITY / 16) as u32;
/// Block numbers handed to never-seen blocks (scan and pre-warm) start here, far from the others.
pub(crate) const FRESH_BASE: u32 = 1 << 24;
/// Zipf exponent of the hot reads.
const ZIPF_S: f64 = 0.8;

/// materialized: page keys, versions per key at most, and the "latest" request LSN.
const MAT_KEYS: usize = 50_000;
pub(crate) const MAT_VERSIONS: usize = 4;
const MAT_TIP: Lsn = Lsn(0x0000_7FFF_0000_0000);

/// Length of every op stream; also the number of ops in each untimed hit-ratio pass. The timed
/// runs cycle through it. A multiple of BATCH.
const STREAM_OPS: usize = 1 << 21;
/// Ops replayed (untimed) after populating a cache and before counting or timing.
pub(crate) const WARM_OPS: usize = 1 << 18;
/// Steps per criterion iteration.
pub(crate) const BATCH: usize = 1024;

const DEFAULT_SEED: u64 = 0x7A6E_C0DE_5EED_2024;

// ---------------------------------------------------------------------------------------------
// Deterministic randomness: splitmix64 (no `rand` dependency).

struct SplitMix(u64);

impl SplitMix {
    fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (multiply-high range reduction).
    fn below(&mut self, n: u64) -> u64 {
        scale(self.next_u64(), n)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Maps a full-range 64-bit value onto `0..n`, keeping its order.
fn scale(raw: u64, n: u64) -> u64 {
    ((u128::from(raw) * u128::from(n)) >> 64) as u64
}

/// Zipf over ranks `0..n` by inverse CDF (binary search over a precomputed table).
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|rank| {
                acc += (rank as f64).powf(-s);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut SplitMix) -> u32 {
        let u = rng.unit();
        let rank = self.cdf.partition_point(|&c| c <= u);
        rank.min(self.cdf.len() - 1) as u32
    }
}

pub(crate) fn seed_from_env() -> u64 {
    let Ok(text) = std::env::var("PAGE_CACHE_BENCH_SEED") else {
        return DEFAULT_SEED;
    };
    let text = text.trim();
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.unwrap_or_else(|e| panic!("PAGE_CACHE_BENCH_SEED={text:?}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Page contents. Every page is a copy of one random template with a stamp in its first and last
// 8 bytes that says which page it is, so a returned page can be checked.

pub(crate) fn file_stamp(key: u32) -> (u64, u64) {
    let s = 0xF11E_0000_0000_0000 | u64::from(key);
    (s, !s)
}

pub(crate) fn mat_stamp(page: u32, lsn: Lsn) -> (u64, u64) {
    (0x3A7E_0000_0000_0000 | u64::from(page), lsn.0)
}

pub(crate) fn stamp(page: &mut Page, (head, tail): (u64, u64)) {
    page[..8].copy_from_slice(&head.to_le_bytes());
    page[PAGE_SZ - 8..].copy_from_slice(&tail.to_le_bytes());
}

pub(crate) fn stamp_of(page: &Page) -> (u64, u64) {
    let head = u64::from_le_bytes(page[..8].try_into().expect("8 bytes"));
    let tail = u64::from_le_bytes(page[PAGE_SZ - 8..].try_into().expect("8 bytes"));
    (head, tail)
}

/// "Reads the page from disk": copies the template into `dst` and stamps it.
#[inline]
pub(crate) fn fill(dst: &mut Page, template: &Page, stamp_value: (u64, u64)) {
    dst.copy_from_slice(template);
    stamp(dst, stamp_value);
}

// ---------------------------------------------------------------------------------------------
// Workloads.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileScenario {
    HitPath,
    HitPath2Threads,
    CacheBenchMix,
    ScanPollution,
    PrewarmRead,
}

impl FileScenario {
    pub(crate) const ALL: [FileScenario; 5] = [
        FileScenario::HitPath,
        FileScenario::HitPath2Threads,
        FileScenario::CacheBenchMix,
        FileScenario::ScanPollution,
        FileScenario::PrewarmRead,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            FileScenario::HitPath => "hit_path",
            FileScenario::HitPath2Threads => "hit_path_2threads",
            FileScenario::CacheBenchMix => "cache_bench_mix",
            FileScenario::ScanPollution => "scan_pollution",
            FileScenario::PrewarmRead => "prewarm_read",
        }
    }

    /// Cache operations per op-stream entry (prewarm_read: insert, read-back, hot read).
    pub(crate) fn ops_per_step(self) -> u64 {
        match self {
            FileScenario::PrewarmRead => 3,
            _ => 1,
        }
    }

    pub(crate) fn held(self) -> usize {
        match self {
            FileScenario::CacheBenchMix => MIX_HELD,
            _ => 0,
        }
    }
}

// cache_bench_mix op kinds, in the top bits of an op; the key is in the low bits.
pub(crate) const MIX_KIND_SHIFT: u32 = 28;
pub(crate) const MIX_KEY_MASK: u32 = (1 << MIX_KIND_SHIFT) - 1;
pub(crate) const MIX_LOOKUP_INSERT: u32 = 0;
pub(crate) const MIX_INSERT_HOLD: u32 = 1;
pub(crate) const MIX_BLIND_INSERT: u32 = 2;
pub(crate) const MIX_LOOKUP: u32 = 3;
pub(crate) const MIX_ERASE_AS_LOOKUP: u32 = 4;

/// scan_pollution: the op that reads the next block of the scan.
pub(crate) const SCAN_NEXT: u32 = u32::MAX;

/// One materialized request: page `page` at `request`; `needed` is the version that answers it
/// exactly (the newest version of the page at or below `request`).
#[derive(Clone, Copy)]
pub(crate) struct MatOp {
    pub(crate) page: u32,
    pub(crate) request: Lsn,
    pub(crate) needed: Lsn,
}

pub(crate) struct Workloads {
    pub(crate) template: Box<Page>,
    hit_path: Vec<u32>,
    mix: Vec<u32>,
    scan: Vec<u32>,
    /// Low 16 bits: read-back distance; high 16 bits: hot key.
    prewarm: Vec<u32>,
    pub(crate) mat_keys: Vec<MaterializedPageKey>,
    /// Every page's versions, ascending.
    pub(crate) mat_versions: Vec<Vec<Lsn>>,
    pub(crate) mat_ops: Vec<MatOp>,
}

impl Workloads {
    pub(crate) fn generate(seed: u64) -> Self {
        // One independent generator per stream, so a stream does not change when another does.
        let mut seeds = SplitMix::new(seed);
        let mut rng = || SplitMix::new(seeds.next_u64());

        let mut r = rng();
        let mut template = Box::new([0u8; PAGE_SZ]);
        for chunk in template.chunks_exact_mut(8) {
            chunk.copy_from_slice(&r.next_u64().to_le_bytes());
        }

        let mut r = rng();
        let hit_path = (0..STREAM_OPS)
            .map(|_| r.below(u64::from(HOT_KEYS)) as u32)
            .collect();

        // cache_bench: the key is the smallest of 6 uniform draws, mapped onto the key space,
        // so low keys are much hotter than high ones.
        let mut r = rng();
        let mix = (0..STREAM_OPS)
            .map(|_| {
                let raw = (0..6).map(|_| r.next_u64()).min().expect("six draws");
                let key = scale(raw, u64::from(MIX_KEYS)) as u32;
                let kind = match r.below(100) {
                    0..=81 => MIX_LOOKUP_INSERT, // 82%
                    82..=83 => MIX_INSERT_HOLD,  // 2%
                    84..=88 => MIX_BLIND_INSERT, // 5%
                    89..=98 => MIX_LOOKUP,       // 10%
                    _ => MIX_ERASE_AS_LOOKUP,    // 1%
                };
                (kind << MIX_KIND_SHIFT) | key
            })
            .collect();

        let hot = Zipf::new(HOT_KEYS as usize, ZIPF_S);
        let mut r = rng();
        let scan = (0..STREAM_OPS)
            .map(|_| {
                if r.below(100) < 70 {
                    hot.sample(&mut r)
                } else {
                    SCAN_NEXT
                }
            })
            .collect();

        let mut r = rng();
        let prewarm = (0..STREAM_OPS)
            .map(|_| {
                let distance = 1 + r.below(u64::from(PREWARM_MAX_DISTANCE)) as u32;
                (hot.sample(&mut r) << 16) | distance
            })
            .collect();

        let mat_keys: Vec<MaterializedPageKey> = (0..MAT_KEYS as u32)
            .map(|p| MaterializedPageKey {
                tenant_id: TenantId::from_bytes([0x7E; 16]),
                timeline_id: TimelineId::from_bytes([0x71; 16]),
                key: Key::rel_block(1663, 13_000, 16_384 + p / 10_000, 0, p % 10_000),
            })
            .collect();
        let mut r = rng();
        let mat_versions: Vec<Vec<Lsn>> = (0..MAT_KEYS)
            .map(|_| {
                let count = 1 + r.below(MAT_VERSIONS as u64) as usize;
                let mut lsn = 0x0100_0000 + r.below(1 << 20) * 8;
                (0..count)
                    .map(|_| {
                        lsn += (1 + r.below(4096)) * 8;
                        Lsn(lsn)
                    })
                    .collect()
            })
            .collect();
        let pages = Zipf::new(MAT_KEYS, ZIPF_S);
        let mut r = rng();
        let mat_ops = (0..STREAM_OPS)
            .map(|_| {
                let page = pages.sample(&mut r);
                let versions = &mat_versions[page as usize];
                let newest = *versions.last().expect("at least one version");
                if r.below(100) < 80 || versions.len() == 1 {
                    // At the latest LSN (a single-version page has no older LSN to ask for).
                    MatOp {
                        page,
                        request: MAT_TIP,
                        needed: newest,
                    }
                } else {
                    // A random LSN from the first version up to just below the newest.
                    let first = versions[0].0;
                    let request = Lsn(first + r.below(newest.0 - first));
                    let below = versions.partition_point(|l| *l <= request);
                    MatOp {
                        page,
                        request,
                        needed: versions[below - 1],
                    }
                }
            })
            .collect();

        Workloads {
            template,
            hit_path,
            mix,
            scan,
            prewarm,
            mat_keys,
            mat_versions,
            mat_ops,
        }
    }

    pub(crate) fn file_ops(&self, scenario: FileScenario) -> &[u32] {
        match scenario {
            FileScenario::HitPath | FileScenario::HitPath2Threads => &self.hit_path,
            FileScenario::CacheBenchMix => &self.mix,
            FileScenario::ScanPollution => &self.scan,
            FileScenario::PrewarmRead => &self.prewarm,
        }
    }
}
