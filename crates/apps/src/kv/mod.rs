//! `kv-server`: a memcached-compatible key-value server (docs/design.md,
//! "Applications, load and experiments"), one module per mechanism:
//!
//! * [`store`]: the items (cas, expiry, the memory limit with LRU eviction,
//!   the item-size limit), sharded behind uthread locks.
//! * [`text`]: memcached's text protocol, a pure incremental parser and
//!   the executor of its commands.
//! * [`meta`]: the text protocol's meta commands (mg, ms, md).
//! * [`binary`]: memcached's binary protocol.
//! * [`udp`]: the 8-byte frame header memcached puts on UDP datagrams.
//! * [`server`]: the TCP and UDP serving loops on `ginza_runtime::net`.
//!
//! Replies are memcached 1.6's byte for byte (the differential tests in
//! `crates/apps/tests/kv_differential.rs` hold both protocols to Debian's
//! memcached), except where this server differs on purpose or does less:
//!
//! * `version` says [`VERSION`]; cas uniques are this server's own; `stats`
//!   reports a subset of memcached's counters (`stats settings` and
//!   `stats reset` too; other `stats` arguments, `slabs`, `lru`,
//!   `lru_crawler`, `watch`, `cache_memlimit` and `me` get `ERROR`);
//!   `shutdown` is always disabled.
//! * Memory: each shard of the store holds `memory_limit / shards` and
//!   evicts its own least recently used items (memcached's LRUs are per
//!   slab class, so neither is one global LRU). An item is charged
//!   memcached's item size (header, key, value), which also decides the
//!   item-size limit exactly as memcached's `-I` does.
//! * A delayed `flush_all` drops the items stored before its time comes
//!   (memcached compares their last access time).
//! * Meta commands: see [`meta`] for the flags not supported.
//! * A get line without a newline is buffered up to 1 MiB (memcached:
//!   unbounded); other lines over 2048 bytes close the connection, as in
//!   memcached.

pub mod binary;
mod command;
pub mod meta;
mod number;
pub mod server;
pub mod store;
pub mod text;
pub mod udp;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use store::Store;

/// The version `version` reports. memcached clients parse it as
/// major.minor.patch to pick features; this server speaks 1.6's protocol.
pub const VERSION: &str = "1.6.0-ginza";

/// Command counters for `stats` (memcached's names).
#[derive(Debug, Default)]
pub struct KvStats {
    pub curr_connections: AtomicU64,
    pub total_connections: AtomicU64,
    pub cmd_get: AtomicU64,
    pub cmd_set: AtomicU64,
    pub cmd_flush: AtomicU64,
    pub cmd_touch: AtomicU64,
    pub get_hits: AtomicU64,
    pub get_misses: AtomicU64,
    pub delete_hits: AtomicU64,
    pub delete_misses: AtomicU64,
    pub incr_hits: AtomicU64,
    pub incr_misses: AtomicU64,
    pub decr_hits: AtomicU64,
    pub decr_misses: AtomicU64,
    pub cas_hits: AtomicU64,
    pub cas_misses: AtomicU64,
    pub cas_badval: AtomicU64,
    pub touch_hits: AtomicU64,
    pub touch_misses: AtomicU64,
    pub store_too_large: AtomicU64,
    pub store_no_memory: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub udp_requests: AtomicU64,
    pub udp_errors: AtomicU64,
}

impl KvStats {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }
}

/// What every connection of one server shares.
#[derive(Debug, Clone)]
pub struct Kv {
    pub store: Arc<Store>,
    pub stats: Arc<KvStats>,
    /// Worker kthreads (reported as `threads`).
    pub threads: usize,
}

impl Kv {
    pub fn new(store: Store) -> Kv {
        Kv {
            store: Arc::new(store),
            stats: Arc::new(KvStats::default()),
            threads: 1,
        }
    }

    /// memcached's general statistics, as (name, value) pairs.
    pub fn general_stats(&self) -> Vec<(&'static str, String)> {
        let s = &self.stats;
        let st = &self.store.stats;
        let now = self.store.now();
        let (items, bytes) = self.store.usage();
        let g = |c: &AtomicU64| c.load(Relaxed).to_string();
        vec![
            ("pid", std::process::id().to_string()),
            (
                "uptime",
                now.saturating_sub(self.store.started()).to_string(),
            ),
            ("time", now.to_string()),
            ("version", VERSION.to_string()),
            (
                "pointer_size",
                (8 * std::mem::size_of::<usize>()).to_string(),
            ),
            ("curr_connections", g(&s.curr_connections)),
            ("total_connections", g(&s.total_connections)),
            ("cmd_get", g(&s.cmd_get)),
            ("cmd_set", g(&s.cmd_set)),
            ("cmd_flush", g(&s.cmd_flush)),
            ("cmd_touch", g(&s.cmd_touch)),
            ("get_hits", g(&s.get_hits)),
            ("get_misses", g(&s.get_misses)),
            ("delete_misses", g(&s.delete_misses)),
            ("delete_hits", g(&s.delete_hits)),
            ("incr_misses", g(&s.incr_misses)),
            ("incr_hits", g(&s.incr_hits)),
            ("decr_misses", g(&s.decr_misses)),
            ("decr_hits", g(&s.decr_hits)),
            ("cas_misses", g(&s.cas_misses)),
            ("cas_hits", g(&s.cas_hits)),
            ("cas_badval", g(&s.cas_badval)),
            ("touch_hits", g(&s.touch_hits)),
            ("touch_misses", g(&s.touch_misses)),
            ("store_too_large", g(&s.store_too_large)),
            ("store_no_memory", g(&s.store_no_memory)),
            ("bytes_read", g(&s.bytes_read)),
            ("bytes_written", g(&s.bytes_written)),
            (
                "limit_maxbytes",
                self.store.config().memory_limit.to_string(),
            ),
            ("threads", self.threads.to_string()),
            ("bytes", bytes.to_string()),
            ("curr_items", items.to_string()),
            ("total_items", g(&st.total_items)),
            ("evictions", g(&st.evictions)),
            ("reclaimed", g(&st.reclaimed)),
        ]
    }
}
