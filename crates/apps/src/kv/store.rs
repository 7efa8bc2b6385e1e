//! The items of `kv-server`: a hash table split into shards, each behind
//! its own lock with its own LRU list and its share of the memory limit.
//!
//! * Every mutation of one key (set, cas, incr/decr, append, ...) runs
//!   under its shard's lock, so cas and incr are atomic with respect to
//!   each other (docs/design.md, "Applications, load and experiments").
//! * Expiration times follow memcached: 0 never expires; up to 30 days is
//!   relative to now; more is an absolute unix time; negative is already
//!   expired. Expired and flushed items are dropped when met.
//! * Memory: each item is charged its key, its value and memcached's
//!   per-item header; when a shard's share is exceeded its least recently
//!   used items go first (expired ones are simply the first met).
//! * The clock is injected ([`Clock`]), so tests move time by hand.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use ginza_runtime::sync::Mutex;

/// Longest key memcached accepts.
pub const KEY_MAX_LENGTH: usize = 250;
/// Expiration times above this (30 days) are absolute unix times.
pub const REALTIME_MAXDELTA: i64 = 60 * 60 * 24 * 30;
/// What memcached charges an item besides its key and value: its item
/// header (48 bytes), the cas value (8), the key's terminating NUL (1) and
/// the value's trailing "\r\n" (2); non-zero client flags add 4 more.
pub const ITEM_HEADER: usize = 48 + 8 + 1 + 2;
/// Default `-I`: 1 MiB.
pub const DEFAULT_ITEM_SIZE_MAX: usize = 1 << 20;
/// Default `-m`: 64 MiB.
pub const DEFAULT_MEMORY_LIMIT: usize = 64 << 20;

/// Seconds since the unix epoch, as the store sees them.
pub trait Clock: Send + Sync {
    fn now(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }
}

/// A clock tests set by hand.
#[derive(Debug)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(now: u64) -> Arc<ManualClock> {
        Arc::new(ManualClock(AtomicU64::new(now)))
    }
    pub fn advance(&self, secs: u64) {
        self.0.fetch_add(secs, Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Sizes of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreConfig {
    /// Bytes all items may take together (memcached's `-m`).
    pub memory_limit: usize,
    /// The largest item, header included (memcached's `-I`).
    pub item_size_max: usize,
    /// Shards, each with its own lock, LRU and `memory_limit / shards`.
    pub shards: usize,
}

impl StoreConfig {
    /// `memory_limit` and `item_size_max` with as many shards (at most 16)
    /// as leave each room for two largest items.
    pub fn new(memory_limit: usize, item_size_max: usize) -> StoreConfig {
        let shards = (memory_limit / item_size_max.max(1) / 2).clamp(1, 16);
        StoreConfig {
            memory_limit,
            item_size_max,
            shards,
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig::new(DEFAULT_MEMORY_LIMIT, DEFAULT_ITEM_SIZE_MAX)
    }
}

/// One item as a reader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub value: Vec<u8>,
    pub flags: u32,
    pub cas: u64,
    /// Absolute unix time it expires at, 0 for never.
    pub expires: u64,
}

/// How a storage command treats an existing item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    /// Store only if the item's cas unique is this one.
    Cas(u64),
}

/// What a storage command did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOutcome {
    /// Stored, with this cas unique.
    Stored(u64),
    /// add on an existing key, replace/append/prepend on a missing one.
    NotStored,
    /// cas: someone stored the item since its cas unique was read.
    Exists,
    /// cas: there is no such item.
    NotFound,
    /// Larger than the item-size limit (a set also removes the old item).
    TooLarge,
    /// Cannot fit into memory even after evicting.
    OutOfMemory,
}

/// What incr/decr did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeltaOutcome {
    /// The new value and the item's new cas unique.
    Value(u64, u64),
    NotFound,
    /// The item's value is not a decimal unsigned 64-bit number.
    NonNumeric,
    /// The cas unique given did not match (binary protocol).
    Exists,
}

/// Where a meta get stands on an item's right to recache it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recache {
    /// Nothing to say (no `W` or `Z` flag).
    None,
    /// This get won the right (`W`).
    Win,
    /// An earlier get won it (`Z`).
    Won,
}

/// Counters of a store (for `stats`).
#[derive(Debug, Default)]
pub struct StoreStats {
    pub evictions: AtomicU64,
    pub expired_unfetched: AtomicU64,
    pub reclaimed: AtomicU64,
    pub total_items: AtomicU64,
}

const NIL: usize = usize::MAX;

struct Node {
    key: Box<[u8]>,
    item: Item,
    /// Unix time it was stored (for a delayed flush_all).
    stored_at: u64,
    /// A meta get has handed out the right to recache it (its `W` flag);
    /// later ones see `Z` (memcached's token-sent bit).
    token_sent: bool,
    /// Towards the most recently used end.
    prev: usize,
    /// Towards the least recently used end.
    next: usize,
}

/// One shard: a map from key to a slot of `nodes`, the slots doubly linked
/// in LRU order (`head` most recent).
struct Shard {
    map: HashMap<Box<[u8]>, usize>,
    nodes: Vec<Option<Node>>,
    free: Vec<usize>,
    head: usize,
    tail: usize,
    used: usize,
    limit: usize,
}

fn charge(key: &[u8], value: &[u8], flags: u32) -> usize {
    ITEM_HEADER + key.len() + value.len() + if flags != 0 { 4 } else { 0 }
}

impl Shard {
    fn new(limit: usize) -> Shard {
        Shard {
            map: HashMap::new(),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            used: 0,
            limit,
        }
    }

    fn node(&self, slot: usize) -> &Node {
        self.nodes[slot].as_ref().expect("a linked slot")
    }

    fn node_mut(&mut self, slot: usize) -> &mut Node {
        self.nodes[slot].as_mut().expect("a linked slot")
    }

    fn unlink(&mut self, slot: usize) {
        let (prev, next) = {
            let n = self.node(slot);
            (n.prev, n.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.node_mut(prev).next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.node_mut(next).prev = prev;
        }
    }

    fn push_front(&mut self, slot: usize) {
        let old = self.head;
        {
            let n = self.node_mut(slot);
            n.prev = NIL;
            n.next = old;
        }
        if old == NIL {
            self.tail = slot;
        } else {
            self.node_mut(old).prev = slot;
        }
        self.head = slot;
    }

    /// Marks `slot` most recently used.
    fn bump(&mut self, slot: usize) {
        if self.head != slot {
            self.unlink(slot);
            self.push_front(slot);
        }
    }

    fn remove_slot(&mut self, slot: usize) -> Node {
        self.unlink(slot);
        let node = self.nodes[slot].take().expect("a linked slot");
        self.free.push(slot);
        self.map.remove(&node.key);
        self.used -= charge(&node.key, &node.item.value, node.item.flags);
        node
    }

    fn remove(&mut self, key: &[u8]) -> Option<Node> {
        let slot = *self.map.get(key)?;
        Some(self.remove_slot(slot))
    }

    /// Links a new node for `key` (which must be absent) at the front;
    /// gives its slot.
    fn insert(&mut self, key: Box<[u8]>, item: Item, stored_at: u64) -> usize {
        self.used += charge(&key, &item.value, item.flags);
        let node = Node {
            key: key.clone(),
            item,
            stored_at,
            token_sent: false,
            prev: NIL,
            next: NIL,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.nodes[slot] = Some(node);
                slot
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        };
        self.map.insert(key, slot);
        self.push_front(slot);
        slot
    }

    fn clear(&mut self) {
        self.map.clear();
        self.nodes.clear();
        self.free.clear();
        self.head = NIL;
        self.tail = NIL;
        self.used = 0;
    }
}

/// Why an item is gone though it is still in its shard.
fn is_dead(node: &Node, now: u64, flush: &FlushState) -> bool {
    let expired = node.item.expires != 0 && node.item.expires <= now;
    let flushed_now = node.item.cas < flush.before_cas;
    let flushed_later = flush.at != 0 && flush.at <= now && node.stored_at < flush.at;
    expired || flushed_now || flushed_later
}

/// The effect of flush_all: items with a cas unique below `before_cas`
/// are gone; from unix time `at` (0: none), so are items stored before it.
#[derive(Debug, Default, Clone, Copy)]
struct FlushState {
    before_cas: u64,
    at: u64,
}

/// The items of one server.
pub struct Store {
    shards: Box<[Mutex<Shard>]>,
    config: StoreConfig,
    clock: Arc<dyn Clock>,
    next_cas: AtomicU64,
    flush: Mutex<FlushState>,
    /// Unix time the store was made (memcached's "process started").
    started: u64,
    pub stats: StoreStats,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("config", &self.config)
            .finish()
    }
}

/// Where one key lives.
fn hash_key(key: &[u8]) -> u64 {
    // FNV-1a: fast, and good enough to spread keys over a handful of shards
    // (the per-shard HashMap hashes with its own random keys).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Store {
    pub fn new(config: StoreConfig, clock: Arc<dyn Clock>) -> Store {
        let shards = config.shards.max(1);
        let limit = config.memory_limit / shards;
        let started = clock.now();
        Store {
            shards: (0..shards).map(|_| Mutex::new(Shard::new(limit))).collect(),
            config,
            clock,
            next_cas: AtomicU64::new(1),
            flush: Mutex::new(FlushState::default()),
            started,
            stats: StoreStats::default(),
        }
    }

    pub fn config(&self) -> StoreConfig {
        self.config
    }

    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Unix time the store was made.
    pub fn started(&self) -> u64 {
        self.started
    }

    fn shard(&self, key: &[u8]) -> &Mutex<Shard> {
        &self.shards[(hash_key(key) % self.shards.len() as u64) as usize]
    }

    fn new_cas(&self) -> u64 {
        self.next_cas.fetch_add(1, Relaxed)
    }

    fn flush_state(&self) -> FlushState {
        *self.flush.lock()
    }

    /// The absolute expiry (0: never) of a client's `exptime`, as memcached
    /// reads it; an already expired one is 1.
    pub fn expiry(&self, exptime: i64) -> u64 {
        if exptime == 0 {
            0
        } else if exptime < 0 {
            1
        } else if exptime > REALTIME_MAXDELTA {
            let t = exptime as u64;
            if t <= self.started {
                1
            } else {
                t
            }
        } else {
            self.now() + exptime as u64
        }
    }

    /// True if an item this big (key, value, flags) is over the item-size
    /// limit.
    pub fn too_large(&self, key_len: usize, value_len: usize, flags: u32) -> bool {
        ITEM_HEADER + key_len + value_len + if flags != 0 { 4 } else { 0 }
            > self.config.item_size_max
    }

    /// The live slot of `key`, dropping it if it died.
    fn live_slot(
        &self,
        shard: &mut Shard,
        key: &[u8],
        now: u64,
        flush: &FlushState,
    ) -> Option<usize> {
        let slot = *shard.map.get(key)?;
        if is_dead(shard.node(slot), now, flush) {
            shard.remove_slot(slot);
            return None;
        }
        Some(slot)
    }

    /// Makes room for `need` more bytes in `shard`: dead items from the LRU
    /// end first, then live ones (evictions). False if it cannot.
    fn make_room(&self, shard: &mut Shard, need: usize, now: u64, flush: &FlushState) -> bool {
        if need > shard.limit {
            return false;
        }
        while shard.used + need > shard.limit {
            let tail = shard.tail;
            if tail == NIL {
                return false;
            }
            let dead = is_dead(shard.node(tail), now, flush);
            shard.remove_slot(tail);
            if dead {
                self.stats.reclaimed.fetch_add(1, Relaxed);
            } else {
                self.stats.evictions.fetch_add(1, Relaxed);
            }
        }
        true
    }

    /// The item under `key`, marked most recently used.
    pub fn get(&self, key: &[u8]) -> Option<Item> {
        self.fetch(key, None)
    }

    /// The item under `key` with its expiry first set from `exptime`
    /// (get-and-touch).
    pub fn get_and_touch(&self, key: &[u8], exptime: i64) -> Option<Item> {
        self.fetch(key, Some(self.expiry(exptime)))
    }

    fn fetch(&self, key: &[u8], new_expiry: Option<u64>) -> Option<Item> {
        let now = self.now();
        let flush = self.flush_state();
        let mut shard = self.shard(key).lock();
        let slot = self.live_slot(&mut shard, key, now, &flush)?;
        shard.bump(slot);
        let node = shard.node_mut(slot);
        if let Some(expires) = new_expiry {
            node.item.expires = expires;
        }
        Some(node.item.clone())
    }

    /// A meta get (docs: [`super::meta`]): the item under `key`, its expiry
    /// first set from `touch` when given; on a miss with `vivify`, a new
    /// empty item expiring after it, whose recache right this caller wins;
    /// on a hit with `recache`, the right is won when the item expires
    /// within that many seconds. Each item's right is handed out once:
    /// later gets are told it was ([`Recache::Won`]).
    pub fn meta_get(
        &self,
        key: &[u8],
        touch: Option<i64>,
        vivify: Option<i64>,
        recache: Option<i64>,
    ) -> Option<(Item, Recache)> {
        let now = self.now();
        let flush = self.flush_state();
        let new_expiry = touch.map(|t| self.expiry(t));
        let mut shard = self.shard(key).lock();
        let Some(slot) = self.live_slot(&mut shard, key, now, &flush) else {
            let ttl = vivify?;
            let item = Item {
                value: Vec::new(),
                flags: 0,
                cas: self.new_cas(),
                expires: self.expiry(ttl),
            };
            if self.too_large(key.len(), 0, 0)
                || !self.make_room(&mut shard, charge(key, &[], 0), now, &flush)
            {
                return None;
            }
            let slot = shard.insert(key.into(), item.clone(), now);
            shard.node_mut(slot).token_sent = true;
            self.stats.total_items.fetch_add(1, Relaxed);
            return Some((item, Recache::Win));
        };
        shard.bump(slot);
        let node = shard.node_mut(slot);
        if let Some(expires) = new_expiry {
            node.item.expires = expires;
        }
        let expires_soon =
            |r: i64| node.item.expires != 0 && (node.item.expires.saturating_sub(now) as i64) < r;
        let token = if node.token_sent {
            Recache::Won
        } else if recache.is_some_and(expires_soon) {
            node.token_sent = true;
            Recache::Win
        } else {
            Recache::None
        };
        Some((node.item.clone(), token))
    }

    /// Sets the expiry of `key` from `exptime`; false if there is none.
    pub fn touch(&self, key: &[u8], exptime: i64) -> bool {
        self.get_and_touch(key, exptime).is_some()
    }

    /// Stores `value` under `key` as `mode` says.
    pub fn store(
        &self,
        mode: StoreMode,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: i64,
    ) -> StoreOutcome {
        let now = self.now();
        let flush = self.flush_state();
        let expires = self.expiry(exptime);
        let mut shard = self.shard(key).lock();
        if self.too_large(key.len(), value.len(), flags) {
            // memcached: a failed set must not leave the old value readable.
            if mode == StoreMode::Set {
                shard.remove(key);
            }
            return StoreOutcome::TooLarge;
        }
        let existing = self.live_slot(&mut shard, key, now, &flush);
        let new_item = match (mode, existing) {
            (StoreMode::Add, Some(slot)) => {
                // memcached: a failed add still counts as a use.
                shard.bump(slot);
                return StoreOutcome::NotStored;
            }
            (StoreMode::Replace | StoreMode::Append | StoreMode::Prepend, None) => {
                return StoreOutcome::NotStored;
            }
            (StoreMode::Cas(_), None) => return StoreOutcome::NotFound,
            (StoreMode::Cas(unique), Some(slot)) => {
                if shard.node(slot).item.cas != unique {
                    return StoreOutcome::Exists;
                }
                Item {
                    value: value.to_vec(),
                    flags,
                    cas: 0,
                    expires,
                }
            }
            (StoreMode::Append | StoreMode::Prepend, Some(slot)) => {
                // Flags and expiry stay the old item's.
                let old = &shard.node(slot).item;
                if self.too_large(key.len(), old.value.len() + value.len(), old.flags) {
                    return StoreOutcome::NotStored;
                }
                let mut joined = Vec::with_capacity(old.value.len() + value.len());
                if mode == StoreMode::Append {
                    joined.extend_from_slice(&old.value);
                    joined.extend_from_slice(value);
                } else {
                    joined.extend_from_slice(value);
                    joined.extend_from_slice(&old.value);
                }
                Item {
                    value: joined,
                    flags: old.flags,
                    cas: 0,
                    expires: old.expires,
                }
            }
            (StoreMode::Set | StoreMode::Add | StoreMode::Replace, _) => Item {
                value: value.to_vec(),
                flags,
                cas: 0,
                expires,
            },
        };
        let old = existing.map(|slot| shard.remove_slot(slot));
        let need = charge(key, &new_item.value, new_item.flags);
        if !self.make_room(&mut shard, need, now, &flush) {
            // Put the old one back: a store that failed changes nothing.
            if let Some(old) = old {
                let slot = shard.insert(old.key, old.item, old.stored_at);
                shard.node_mut(slot).token_sent = old.token_sent;
            }
            return StoreOutcome::OutOfMemory;
        }
        let cas = self.new_cas();
        let key: Box<[u8]> = match old {
            Some(old) => old.key,
            None => key.into(),
        };
        shard.insert(key, Item { cas, ..new_item }, now);
        self.stats.total_items.fetch_add(1, Relaxed);
        StoreOutcome::Stored(cas)
    }

    /// Removes `key` if it is there (and matches `cas`, unless 0).
    pub fn delete(&self, key: &[u8], cas: u64) -> DeleteOutcome {
        let now = self.now();
        let flush = self.flush_state();
        let mut shard = self.shard(key).lock();
        let Some(slot) = self.live_slot(&mut shard, key, now, &flush) else {
            return DeleteOutcome::NotFound;
        };
        if cas != 0 && shard.node(slot).item.cas != cas {
            return DeleteOutcome::Exists;
        }
        shard.remove_slot(slot);
        DeleteOutcome::Deleted
    }

    /// incr (`incr`) or decr the decimal number under `key` by `delta`:
    /// incr wraps at 2^64, decr stops at 0. A shorter result is padded with
    /// spaces to the old length, as memcached does when it updates in place.
    /// `cas`, unless 0, must match.
    pub fn delta(&self, key: &[u8], incr: bool, delta: u64, cas: u64) -> DeltaOutcome {
        let now = self.now();
        let flush = self.flush_state();
        let mut shard = self.shard(key).lock();
        let Some(slot) = self.live_slot(&mut shard, key, now, &flush) else {
            return DeltaOutcome::NotFound;
        };
        let item = &shard.node(slot).item;
        if cas != 0 && item.cas != cas {
            return DeltaOutcome::Exists;
        }
        let Some(current) = parse_u64_value(&item.value) else {
            return DeltaOutcome::NonNumeric;
        };
        let value = if incr {
            current.wrapping_add(delta)
        } else {
            current.saturating_sub(delta)
        };
        let digits = value.to_string().into_bytes();
        let old_len = item.value.len();
        let new_value = if digits.len() <= old_len {
            let mut v = digits;
            v.resize(old_len, b' ');
            v
        } else {
            digits
        };
        let old = shard.remove_slot(slot);
        let need = charge(key, &new_value, old.item.flags);
        if !self.make_room(&mut shard, need, now, &flush) {
            shard.insert(old.key, old.item, old.stored_at);
            return DeltaOutcome::NotFound;
        }
        let cas = self.new_cas();
        let item = Item {
            value: new_value,
            cas,
            ..old.item
        };
        shard.insert(old.key, item, old.stored_at);
        DeltaOutcome::Value(value, cas)
    }

    /// flush_all: every item now (`delay` ≤ 0), or every item stored before
    /// `delay` seconds from now (read as an expiration time) when that time
    /// comes.
    pub fn flush_all(&self, delay: i64) {
        if delay > 0 {
            self.flush.lock().at = self.expiry(delay);
            return;
        }
        {
            let mut f = self.flush.lock();
            f.before_cas = self.next_cas.load(Relaxed);
            f.at = 0;
        }
        for shard in self.shards.iter() {
            shard.lock().clear();
        }
    }

    /// Items and bytes held now (dead ones not yet dropped included).
    pub fn usage(&self) -> (usize, usize) {
        self.shards.iter().fold((0, 0), |(items, bytes), s| {
            let s = s.lock();
            (items + s.map.len(), bytes + s.used)
        })
    }
}

/// What a delete did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    Deleted,
    NotFound,
    Exists,
}

/// memcached's reading of a stored value as a number (`strtoull`): leading
/// white space, an optional sign, decimal digits, then white space or the
/// end; no overflow; a minus sign only on a value that stays below 2^63.
pub fn parse_u64_value(v: &[u8]) -> Option<u64> {
    super::number::strtoull(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(limit: usize, shards: usize) -> (Store, Arc<ManualClock>) {
        let clock = ManualClock::new(1_700_000_000);
        let config = StoreConfig {
            memory_limit: limit,
            item_size_max: DEFAULT_ITEM_SIZE_MAX,
            shards,
        };
        (Store::new(config, clock.clone()), clock)
    }

    fn set(s: &Store, key: &str, value: &str) -> StoreOutcome {
        s.store(StoreMode::Set, key.as_bytes(), value.as_bytes(), 0, 0)
    }

    fn value(s: &Store, key: &str) -> Option<String> {
        s.get(key.as_bytes())
            .map(|i| String::from_utf8(i.value).unwrap())
    }

    #[test]
    fn the_recache_right_is_handed_out_once_per_item() {
        let (s, clock) = store(1 << 20, 1);
        let k = b"r".as_slice();
        assert_eq!(s.meta_get(k, None, None, Some(100)), None);
        let (item, token) = s.meta_get(k, None, Some(30), None).unwrap();
        assert_eq!((item.value.len(), token), (0, Recache::Win));
        assert_eq!(s.meta_get(k, None, None, None).unwrap().1, Recache::Won);
        // A store makes a new item: its right is to be won again, and only
        // once it expires within the R window.
        s.store(StoreMode::Set, k, b"v", 0, 60);
        assert_eq!(
            s.meta_get(k, None, None, Some(30)).unwrap().1,
            Recache::None
        );
        clock.advance(40);
        assert_eq!(s.meta_get(k, None, None, Some(30)).unwrap().1, Recache::Win);
        assert_eq!(s.meta_get(k, None, None, Some(30)).unwrap().1, Recache::Won);
        // Items that never expire are never won by R.
        set(&s, "forever", "v");
        let never = s.meta_get(b"forever", None, None, Some(1_000_000));
        assert_eq!(never.unwrap().1, Recache::None);
    }

    #[test]
    fn set_add_replace_append_prepend() {
        let (s, _) = store(1 << 20, 1);
        assert!(matches!(set(&s, "a", "1"), StoreOutcome::Stored(_)));
        assert_eq!(
            s.store(StoreMode::Add, b"a", b"2", 0, 0),
            StoreOutcome::NotStored
        );
        assert_eq!(value(&s, "a").as_deref(), Some("1"));
        assert!(matches!(
            s.store(StoreMode::Add, b"b", b"2", 7, 0),
            StoreOutcome::Stored(_)
        ));
        assert_eq!(s.get(b"b").unwrap().flags, 7);
        assert_eq!(
            s.store(StoreMode::Replace, b"c", b"x", 0, 0),
            StoreOutcome::NotStored
        );
        assert!(matches!(
            s.store(StoreMode::Replace, b"a", b"3", 0, 0),
            StoreOutcome::Stored(_)
        ));
        s.store(StoreMode::Append, b"b", b"z", 99, 0);
        s.store(StoreMode::Prepend, b"b", b"y", 99, 0);
        let b = s.get(b"b").unwrap();
        assert_eq!(b.value, b"y2z");
        assert_eq!(b.flags, 7, "append/prepend keep the old flags");
        assert_eq!(
            s.store(StoreMode::Append, b"nope", b"z", 0, 0),
            StoreOutcome::NotStored
        );
    }

    #[test]
    fn cas_semantics() {
        let (s, _) = store(1 << 20, 4);
        assert_eq!(
            s.store(StoreMode::Cas(1), b"k", b"v", 0, 0),
            StoreOutcome::NotFound
        );
        let StoreOutcome::Stored(c1) = set(&s, "k", "v1") else {
            panic!()
        };
        assert_eq!(s.get(b"k").unwrap().cas, c1);
        assert_eq!(
            s.store(StoreMode::Cas(c1 + 100), b"k", b"v", 0, 0),
            StoreOutcome::Exists
        );
        let StoreOutcome::Stored(c2) = s.store(StoreMode::Cas(c1), b"k", b"v2", 0, 0) else {
            panic!()
        };
        assert_ne!(c1, c2);
        assert_eq!(
            s.store(StoreMode::Cas(c1), b"k", b"v3", 0, 0),
            StoreOutcome::Exists,
            "an old cas unique no longer matches"
        );
        assert_eq!(value(&s, "k").as_deref(), Some("v2"));
        // incr changes the cas unique too.
        set(&s, "n", "5");
        let before = s.get(b"n").unwrap().cas;
        s.delta(b"n", true, 1, 0);
        assert_ne!(s.get(b"n").unwrap().cas, before);
        assert_eq!(s.delete(b"n", before), DeleteOutcome::Exists);
    }

    #[test]
    fn incr_decr_like_memcached() {
        let (s, _) = store(1 << 20, 1);
        set(&s, "n", "10");
        assert!(matches!(
            s.delta(b"n", false, 1, 0),
            DeltaOutcome::Value(9, _)
        ));
        assert_eq!(value(&s, "n").as_deref(), Some("9 "), "padded in place");
        assert!(matches!(
            s.delta(b"n", false, 100, 0),
            DeltaOutcome::Value(0, _)
        ));
        set(&s, "m", &u64::MAX.to_string());
        assert!(matches!(
            s.delta(b"m", true, 2, 0),
            DeltaOutcome::Value(1, _)
        ));
        set(&s, "x", "12ab");
        assert_eq!(s.delta(b"x", true, 1, 0), DeltaOutcome::NonNumeric);
        set(&s, "e", "");
        assert_eq!(s.delta(b"e", true, 1, 0), DeltaOutcome::NonNumeric);
        assert_eq!(s.delta(b"none", true, 1, 0), DeltaOutcome::NotFound);
        set(&s, "w", "99");
        assert!(matches!(
            s.delta(b"w", true, 1, 0),
            DeltaOutcome::Value(100, _)
        ));
        assert_eq!(value(&s, "w").as_deref(), Some("100"));
    }

    #[test]
    fn expiry_with_an_injected_clock() {
        let (s, clock) = store(1 << 20, 1);
        let now = clock.now() as i64;
        s.store(StoreMode::Set, b"rel", b"v", 0, 10);
        s.store(StoreMode::Set, b"abs", b"v", 0, now + 100);
        s.store(StoreMode::Set, b"never", b"v", 0, 0);
        s.store(StoreMode::Set, b"neg", b"v", 0, -1);
        s.store(StoreMode::Set, b"past", b"v", 0, now - 1000);
        assert!(s.get(b"neg").is_none(), "negative: expired at once");
        assert!(s.get(b"past").is_none(), "absolute time in the past");
        clock.advance(9);
        assert!(s.get(b"rel").is_some());
        clock.advance(1);
        assert!(s.get(b"rel").is_none(), "relative 10 s");
        clock.advance(89);
        assert!(s.get(b"abs").is_some());
        clock.advance(1);
        assert!(s.get(b"abs").is_none(), "absolute unix time");
        clock.advance(REALTIME_MAXDELTA as u64);
        assert!(s.get(b"never").is_some());
        // touch and gat move the expiry.
        s.store(StoreMode::Set, b"t", b"v", 0, 5);
        assert!(s.touch(b"t", 100));
        clock.advance(50);
        assert!(s.get(b"t").is_some());
        assert_eq!(s.get_and_touch(b"t", -1).unwrap().value, b"v");
        assert!(s.get(b"t").is_none());
        assert!(!s.touch(b"gone", 10));
    }

    #[test]
    fn flush_all_now_and_later() {
        let (s, clock) = store(1 << 20, 4);
        set(&s, "a", "1");
        s.flush_all(0);
        assert!(s.get(b"a").is_none());
        set(&s, "a", "2");
        assert_eq!(
            value(&s, "a").as_deref(),
            Some("2"),
            "stored after the flush"
        );
        s.flush_all(10);
        clock.advance(9);
        assert!(s.get(b"a").is_some());
        clock.advance(1);
        assert!(s.get(b"a").is_none(), "flushed when the delay ran out");
        set(&s, "b", "3");
        assert!(s.get(b"b").is_some(), "stored after the delayed flush");
    }

    #[test]
    fn lru_eviction_under_the_memory_limit() {
        let item = charge(b"k00", &[0u8; 100], 0);
        let (s, _) = store(item * 4, 1);
        let v = [b'x'; 100];
        for k in ["k00", "k01", "k02", "k03"] {
            assert!(matches!(
                s.store(StoreMode::Set, k.as_bytes(), &v, 0, 0),
                StoreOutcome::Stored(_)
            ));
        }
        // k00 is used, so k01 is now the least recently used.
        assert!(s.get(b"k00").is_some());
        s.store(StoreMode::Set, b"k04", &v, 0, 0);
        assert!(s.get(b"k01").is_none(), "the LRU item went");
        for k in ["k00", "k02", "k03", "k04"] {
            assert!(s.get(k.as_bytes()).is_some(), "{k}");
        }
        assert_eq!(s.stats.evictions.load(Relaxed), 1);
        assert_eq!(s.usage(), (4, item * 4));
        // Something larger than the whole share cannot be stored.
        let big = vec![0u8; item * 5];
        assert_eq!(
            s.store(StoreMode::Set, b"big", &big, 0, 0),
            StoreOutcome::OutOfMemory
        );
        assert!(s.usage().1 <= item * 4);
    }

    #[test]
    fn cas_and_incr_are_atomic_across_threads() {
        // Plain threads: the store's uthread Mutex spins outside a runtime.
        let (s, _) = store(1 << 20, 4);
        let s = Arc::new(s);
        set(&s, "c", "0");
        set(&s, "i", "0");
        const THREADS: u64 = 6;
        const EACH: u64 = 300;
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..EACH {
                        loop {
                            let item = s.get(b"c").unwrap();
                            let n: u64 = std::str::from_utf8(&item.value)
                                .unwrap()
                                .trim()
                                .parse()
                                .unwrap();
                            let next = (n + 1).to_string();
                            match s.store(StoreMode::Cas(item.cas), b"c", next.as_bytes(), 0, 0) {
                                StoreOutcome::Stored(_) => break,
                                StoreOutcome::Exists => continue,
                                other => panic!("{other:?}"),
                            }
                        }
                        assert!(matches!(s.delta(b"i", true, 1, 0), DeltaOutcome::Value(..)));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let n = (THREADS * EACH).to_string();
        assert_eq!(value(&s, "c").as_deref(), Some(n.as_str()));
        assert_eq!(value(&s, "i").as_deref(), Some(n.as_str()));
    }

    #[test]
    fn the_item_size_limit() {
        let (s, _) = store(8 << 20, 1);
        set(&s, "k", "old");
        let max = DEFAULT_ITEM_SIZE_MAX - ITEM_HEADER - 1;
        assert!(matches!(
            s.store(StoreMode::Set, b"k", &vec![0; max], 0, 0),
            StoreOutcome::Stored(_)
        ));
        assert_eq!(
            s.store(StoreMode::Set, b"k", &vec![0; max + 1], 0, 0),
            StoreOutcome::TooLarge
        );
        assert!(
            s.get(b"k").is_none(),
            "a too large set removes the old value"
        );
        set(&s, "a", "x");
        assert_eq!(
            s.store(StoreMode::Append, b"a", &vec![0; max], 0, 0),
            StoreOutcome::NotStored,
            "an append that would grow past the limit"
        );
    }
}
