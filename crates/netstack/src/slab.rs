//! Handles the netstack hands out (connection and listener ids): a slab
//! index and a generation in one non-zero `u32`, so a stale id (its slot
//! reused since) or an invented one finds nothing (docs/protected.md,
//! "Connection ids").

/// Bits of the slot index; the rest is the generation.
const INDEX_BITS: u32 = 20;
/// Most entries a slab holds.
pub const MAX_ENTRIES: u32 = (1 << INDEX_BITS) - 1;

struct Entry<T> {
    generation: u32,
    value: Option<T>,
}

/// A slab of `T` addressed by generation-checked handles.
pub struct Slab<T> {
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
    limit: u32,
    len: usize,
}

impl<T> Slab<T> {
    /// A slab of at most `limit` entries (clamped to [`MAX_ENTRIES`]).
    pub fn new(limit: u32) -> Slab<T> {
        Slab {
            entries: Vec::new(),
            free: Vec::new(),
            limit: limit.clamp(1, MAX_ENTRIES),
            len: 0,
        }
    }

    fn handle(index: u32, generation: u32) -> u32 {
        (generation << INDEX_BITS) | (index + 1)
    }

    fn split(handle: u32) -> Option<(usize, u32)> {
        let index = (handle & MAX_ENTRIES).checked_sub(1)?;
        Some((index as usize, handle >> INDEX_BITS))
    }

    /// Stores `value`; its handle, or `None` when full.
    pub fn insert(&mut self, value: T) -> Option<u32> {
        let index = match self.free.pop() {
            Some(i) => i,
            None if (self.entries.len() as u32) < self.limit => {
                self.entries.push(Entry {
                    generation: 0,
                    value: None,
                });
                self.entries.len() as u32 - 1
            }
            None => return None,
        };
        let e = &mut self.entries[index as usize];
        e.value = Some(value);
        self.len += 1;
        Some(Self::handle(index, e.generation))
    }

    pub fn get(&self, handle: u32) -> Option<&T> {
        let (i, g) = Self::split(handle)?;
        let e = self.entries.get(i)?;
        (e.generation == g).then_some(e.value.as_ref()?)
    }

    pub fn get_mut(&mut self, handle: u32) -> Option<&mut T> {
        let (i, g) = Self::split(handle)?;
        let e = self.entries.get_mut(i)?;
        if e.generation != g {
            return None;
        }
        e.value.as_mut()
    }

    /// Takes the value out; the handle (and every copy of it) is dead.
    pub fn remove(&mut self, handle: u32) -> Option<T> {
        let (i, g) = Self::split(handle)?;
        let e = self.entries.get_mut(i)?;
        if e.generation != g {
            return None;
        }
        let v = e.value.take()?;
        e.generation = (e.generation + 1) & ((1 << (32 - INDEX_BITS)) - 1);
        self.free.push(i as u32);
        self.len -= 1;
        Some(v)
    }

    /// Takes the value out but keeps its slot and handle reserved (see
    /// [`Self::restore`], [`Self::release`]).
    pub fn take(&mut self, handle: u32) -> Option<T> {
        let (i, g) = Self::split(handle)?;
        let e = self.entries.get_mut(i)?;
        if e.generation != g {
            return None;
        }
        e.value.take()
    }

    /// Puts back what [`Self::take`] took.
    pub fn restore(&mut self, handle: u32, value: T) {
        if let Some((i, g)) = Self::split(handle) {
            if let Some(e) = self.entries.get_mut(i) {
                if e.generation == g && e.value.is_none() {
                    e.value = Some(value);
                }
            }
        }
    }

    /// Frees the slot of a taken value: the handle is dead.
    pub fn release(&mut self, handle: u32) {
        if let Some((i, g)) = Self::split(handle) {
            if let Some(e) = self.entries.get_mut(i) {
                if e.generation == g && e.value.is_none() {
                    e.generation = (e.generation + 1) & ((1 << (32 - INDEX_BITS)) - 1);
                    self.free.push(i as u32);
                    self.len -= 1;
                }
            }
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Handles of every entry.
    pub fn handles(&self) -> Vec<u32> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.value.is_some())
            .map(|(i, e)| Self::handle(i as u32, e.generation))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_and_invented_handles_find_nothing() {
        let mut s = Slab::new(2);
        let a = s.insert("a").unwrap();
        let b = s.insert("b").unwrap();
        assert_ne!(a, 0);
        assert_eq!(s.insert("c"), None);
        assert_eq!(s.remove(a), Some("a"));
        let c = s.insert("c").unwrap();
        assert_ne!(a, c, "a reused slot gets a new generation");
        assert_eq!(s.get(a), None);
        assert_eq!(s.get(c), Some(&"c"));
        assert_eq!(s.get(b), Some(&"b"));
        for forged in [0, u32::MAX, c ^ (1 << 25), 3] {
            assert!(s.get(forged).is_none() || forged == b || forged == c);
        }
        assert_eq!(s.len(), 2);
        assert_eq!(s.handles().len(), 2);
    }
}
