//! The netstack's command decoder (and the application's event decoder)
//! on arbitrary slots: whatever an application writes in its command ring
//! reaches `Command::decode` (docs/protected.md, "Slot encoding").
//!
//! Checked: decoding never panics, and a slot that decodes re-encodes to
//! exactly that slot (every unused word must be zero, so no two slots mean
//! the same message).

#![no_main]

use ginza_proto::netstack::{Command, Event, Slot, SLOT_WORDS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The input's first 64 bytes are the slot, little-endian words; a
    // shorter input is zero-padded (most of a valid slot is zeros).
    let mut slot = Slot::default();
    for (i, word) in slot.words.iter_mut().enumerate().take(SLOT_WORDS) {
        let mut b = [0u8; 4];
        for (k, byte) in b.iter_mut().enumerate() {
            *byte = data.get(i * 4 + k).copied().unwrap_or(0);
        }
        *word = u32::from_le_bytes(b);
    }
    if let Ok(cmd) = Command::decode(&slot) {
        assert_eq!(cmd.encode(), slot, "{cmd:?} re-encodes to another slot");
    }
    if let Ok(ev) = Event::decode(&slot) {
        assert_eq!(ev.encode(), slot, "{ev:?} re-encodes to another slot");
    }
});
