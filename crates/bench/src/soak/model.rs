//! The verifying client's model of one key: the set of values the key may
//! hold now, given every answer seen (docs/soak.md, "What is counted").
//!
//! One connection owns each key, with one request in flight at a time, so
//! the only uncertainty is a request whose answer never came: its write may
//! or may not have been applied, and both outcomes stay possible until a
//! read tells them apart. Values are unique per write (a sequence number in
//! each), so an answer outside the set is either an acknowledged write gone
//! missing (a lost write) or something never written (a wrong answer).

/// What a key holds: absent, or bytes.
pub(crate) type Value = Option<Vec<u8>>;

/// Whether a key holds blobs (set, get, delete, cas) or counters (set of a
/// number, incr, get, delete).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Blob,
    Counter,
}

/// The judgement of one answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Ok,
    /// An acknowledged write is not what the server shows: the key is
    /// absent, or holds an older value of ours.
    LostWrite(String),
    /// An answer no history of acknowledged and unanswered writes explains.
    WrongAnswer(String),
}

/// The possible values of one key.
#[derive(Clone, Debug)]
pub(crate) struct KeyModel {
    pub(crate) index: u64,
    pub(crate) kind: Kind,
    possible: Vec<Value>,
    next_seq: u64,
}

/// The key's name on the wire.
pub(crate) fn key_name(server: &str, index: u64) -> String {
    format!("soakv:{server}:{index:07}")
}

impl KeyModel {
    /// A key the server has never seen (absent).
    pub(crate) fn new(index: u64) -> KeyModel {
        KeyModel {
            index,
            kind: if index.is_multiple_of(2) {
                Kind::Blob
            } else {
                Kind::Counter
            },
            possible: vec![None],
            next_seq: 1,
        }
    }

    /// Forgets everything: the server restarted empty.
    pub(crate) fn reset(&mut self) {
        self.possible = vec![None];
    }

    /// The values it may hold now.
    #[cfg(test)]
    pub(crate) fn possible(&self) -> &[Value] {
        &self.possible
    }

    /// Whether exactly one value is possible.
    #[cfg(test)]
    pub(crate) fn certain(&self) -> bool {
        self.possible.len() == 1
    }

    /// A new value no write to this key has carried before: a blob of
    /// `len` bytes, or for a counter a number larger than any before.
    pub(crate) fn fresh_value(&mut self, len: usize) -> Vec<u8> {
        let seq = self.next_seq;
        self.next_seq += 1;
        match self.kind {
            Kind::Blob => blob(self.index, seq, len),
            // Room above for the increments that follow.
            Kind::Counter => (seq << 32).to_string().into_bytes(),
        }
    }

    /// A write of `v` was acknowledged.
    pub(crate) fn acked_write(&mut self, v: Value) {
        self.possible = vec![v];
    }

    /// A write of `v` got no answer: it may have been applied.
    pub(crate) fn unknown_write(&mut self, v: Value) {
        if !self.possible.contains(&v) {
            self.possible.push(v);
        }
    }

    /// A read answered `got`: judged, and the set narrowed to it.
    pub(crate) fn read(&mut self, got: Value) -> Verdict {
        if self.possible.contains(&got) {
            self.possible = vec![got];
            return Verdict::Ok;
        }
        let verdict = self.explain(&got);
        // Whatever the verdict, the server holds `got` now.
        self.possible = vec![got];
        verdict
    }

    /// A `delete` answered `found` (DELETED) or not (NOT_FOUND).
    pub(crate) fn deleted(&mut self, found: bool) -> Verdict {
        let verdict = if found && !self.possible.iter().any(Option::is_some) {
            Verdict::WrongAnswer("DELETED a key that cannot exist".into())
        } else if !found && !self.possible.contains(&None) {
            Verdict::LostWrite(format!(
                "NOT_FOUND deleting a key that holds {}",
                describe(&self.possible)
            ))
        } else {
            Verdict::Ok
        };
        self.possible = vec![None];
        verdict
    }

    /// What an `incr` by `delta` may leave: each possible number plus it
    /// (absent stays absent).
    fn incremented(&self, delta: u64) -> Vec<Value> {
        self.possible
            .iter()
            .map(|v| {
                v.as_ref().map(|b| {
                    let n = parse_number(b).unwrap_or(0);
                    n.wrapping_add(delta).to_string().into_bytes()
                })
            })
            .collect()
    }

    /// An `incr` by `delta` answered `got` (the new number, or `None` for
    /// NOT_FOUND).
    pub(crate) fn incr_answered(&mut self, delta: u64, got: Option<u64>) -> Verdict {
        let after = self.incremented(delta);
        let got: Value = got.map(|n| n.to_string().into_bytes());
        let verdict = if after.contains(&got) {
            Verdict::Ok
        } else if got.is_none() {
            Verdict::LostWrite(format!(
                "incr found no key that holds {}",
                describe(&self.possible)
            ))
        } else {
            Verdict::WrongAnswer(format!(
                "incr by {delta} answered {} where {} was possible",
                describe(std::slice::from_ref(&got)),
                describe(&after)
            ))
        };
        self.possible = vec![got];
        verdict
    }

    /// An `incr` by `delta` got no answer.
    pub(crate) fn incr_unknown(&mut self, delta: u64) {
        for v in self.incremented(delta) {
            self.unknown_write(v);
        }
    }

    /// Why `got` is outside the set: absent or an older value of ours is a
    /// lost write; anything else was never written.
    fn explain(&self, got: &Value) -> Verdict {
        let Some(bytes) = got else {
            return Verdict::LostWrite(format!(
                "absent, where {} was acknowledged",
                describe(&self.possible)
            ));
        };
        let older = match self.kind {
            Kind::Blob => blob_seq(self.index, bytes).is_some_and(|s| {
                self.possible
                    .iter()
                    .flatten()
                    .all(|p| blob_seq(self.index, p).is_some_and(|q| s < q))
            }),
            Kind::Counter => parse_number(bytes).is_some_and(|n| {
                self.possible
                    .iter()
                    .flatten()
                    .all(|p| parse_number(p).is_some_and(|q| n < q))
            }),
        };
        let what = format!(
            "read {} where {} was possible",
            describe(std::slice::from_ref(got)),
            describe(&self.possible)
        );
        if older {
            Verdict::LostWrite(what)
        } else {
            Verdict::WrongAnswer(what)
        }
    }
}

/// A blob's bytes: `INDEX:SEQ:` and a filler that depends on both, so that
/// a byte changed anywhere, or another key's value, shows.
pub(crate) fn blob(index: u64, seq: u64, len: usize) -> Vec<u8> {
    let mut v = format!("{index}:{seq}:").into_bytes();
    let mut x = index.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seq;
    while v.len() < len {
        // xorshift: cheap, and every byte depends on (index, seq).
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(b'a' + (x % 26) as u8);
    }
    v
}

/// The sequence number of a well-formed blob of key `index`.
fn blob_seq(index: u64, bytes: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut parts = text.splitn(3, ':');
    let i: u64 = parts.next()?.parse().ok()?;
    let seq: u64 = parts.next()?.parse().ok()?;
    (i == index && blob(index, seq, bytes.len()) == bytes).then_some(seq)
}

/// A counter's number.
pub(crate) fn parse_number(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

/// Values, shortened for a report.
fn describe(values: &[Value]) -> String {
    let one = |v: &Value| match v {
        None => "absent".to_string(),
        Some(b) => {
            let s = String::from_utf8_lossy(&b[..b.len().min(24)]).into_owned();
            if b.len() > 24 {
                format!("{s:?}… ({} bytes)", b.len())
            } else {
                format!("{s:?}")
            }
        }
    };
    let all: Vec<String> = values.iter().map(one).collect();
    format!("{{{}}}", all.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acknowledged_set_must_be_read_back() {
        let mut k = KeyModel::new(0);
        let v = k.fresh_value(40);
        k.acked_write(Some(v.clone()));
        assert_eq!(k.read(Some(v)), Verdict::Ok);
        assert!(matches!(k.read(None), Verdict::LostWrite(_)));
    }

    #[test]
    fn an_unanswered_write_leaves_both_outcomes_possible_until_a_read() {
        let mut k = KeyModel::new(0);
        let a = k.fresh_value(40);
        k.acked_write(Some(a.clone()));
        let b = k.fresh_value(40);
        k.unknown_write(Some(b.clone()));
        assert!(!k.certain());
        assert_eq!(k.clone().read(Some(a.clone())), Verdict::Ok);
        assert_eq!(k.read(Some(b.clone())), Verdict::Ok);
        // Narrowed to b: a is an older acknowledged value now.
        assert!(matches!(k.read(Some(a)), Verdict::LostWrite(_)));
    }

    #[test]
    fn a_value_never_written_is_a_wrong_answer() {
        let mut k = KeyModel::new(4);
        let v = k.fresh_value(40);
        k.acked_write(Some(v.clone()));
        let mut flipped = v.clone();
        flipped[30] ^= 1;
        assert!(matches!(
            k.clone().read(Some(flipped)),
            Verdict::WrongAnswer(_)
        ));
        // Another key's value is wrong too.
        assert!(matches!(
            k.clone().read(Some(blob(6, 1, 40))),
            Verdict::WrongAnswer(_)
        ));
        // A newer sequence than any written: never written.
        assert!(matches!(
            k.read(Some(blob(4, 9, 40))),
            Verdict::WrongAnswer(_)
        ));
    }

    #[test]
    fn counters_follow_increments_and_catch_a_lost_one() {
        let mut k = KeyModel::new(1);
        assert_eq!(k.kind, Kind::Counter);
        let v = k.fresh_value(0);
        let n = parse_number(&v).unwrap();
        k.acked_write(Some(v));
        assert_eq!(k.incr_answered(5, Some(n + 5)), Verdict::Ok);
        k.incr_unknown(2);
        assert_eq!(k.possible().len(), 2);
        // The unanswered increment was applied.
        assert_eq!(k.clone().incr_answered(1, Some(n + 8)), Verdict::Ok);
        // It was not.
        assert_eq!(k.clone().incr_answered(1, Some(n + 6)), Verdict::Ok);
        assert!(matches!(
            k.clone().incr_answered(1, Some(n + 99)),
            Verdict::WrongAnswer(_)
        ));
        // Reading the number before the acknowledged +5: lost.
        assert!(matches!(
            k.read(Some(n.to_string().into_bytes())),
            Verdict::LostWrite(_)
        ));
    }

    #[test]
    fn deletes_are_judged_against_the_set() {
        let mut k = KeyModel::new(0);
        assert!(matches!(k.deleted(true), Verdict::WrongAnswer(_)));
        let v = k.fresh_value(20);
        k.acked_write(Some(v));
        assert!(matches!(k.clone().deleted(false), Verdict::LostWrite(_)));
        assert_eq!(k.deleted(true), Verdict::Ok);
        assert_eq!(k.read(None), Verdict::Ok);
        k.reset();
        assert_eq!(k.possible(), &[None]);
    }
}
