//! Zero-touch transmit with many small `send` ranges: every segment is cut
//! where one gather list ends, so iokerneld assembles every frame and the
//! netstack never copies a payload byte, however the application slices
//! its data (docs/protected.md, "Transmit").

mod common;

use common::*;
use ginza_proto::netstack::{Command, Event, Ranges, SendFlags, MAX_RANGES};
use ginza_shm::netstack::TxPoolView;
use std::time::{Duration, Instant};

#[test]
fn tiny_sends_leave_as_gathered_frames_the_netstack_never_copies() {
    // 4,000 pieces of 7 bytes, 16 bytes apart in the tx pool: more than the
    // first congestion window, so later segments would span far more than
    // one gather list's pieces if they were not cut.
    const PIECES: u32 = 4000;
    const LEN: u32 = 7;
    const STRIDE: u32 = 16;
    let mut ns = netstack();
    let mut app = RawApp::attach(&mut ns, "tiny", app_iface());
    ns.set_zero_touch(app.id);
    let pool = TxPoolView::map(app.tx.fd().try_clone_to_owned().unwrap()).unwrap();
    let mut peer = Peer::connect(40001, APP_IP, 9);
    let (conn, _) = accept_one(&mut ns, &mut app, &mut peer);

    let mut want = Vec::new();
    let pieces: Vec<_> = (0..PIECES)
        .map(|i| {
            let r = range(i * STRIDE, LEN);
            let bytes: Vec<u8> = (0..LEN).map(|k| (i * 31 + k) as u8).collect();
            app.tx.get_mut(r).unwrap().copy_from_slice(&bytes);
            want.extend_from_slice(&bytes);
            r
        })
        .collect();
    // Every `send` before the peer hears anything: the first congestion
    // window leaves in small segments (held back here), the rest waits in
    // the connection and leaves in full ones once the acknowledgments come.
    let mut held = Vec::new();
    for batch in pieces.chunks(16 * MAX_RANGES) {
        for chunk in batch.chunks(MAX_RANGES) {
            app.cmd(Command::Send {
                conn,
                ranges: Ranges::from_slice(chunk).unwrap(),
                flags: SendFlags::default(),
            });
        }
        ns.poll();
        while let Some(f) = ns.pop_frame() {
            held.push(on_the_wire(f, Some(&pool)));
        }
    }
    for f in &held {
        assert!(peer.on_frame(f), "a segment for the peer");
    }
    let mut acked = 0u64;
    let deadline = Instant::now() + Duration::from_secs(20);
    while peer.got.len() < want.len() || acked < want.len() as u64 {
        step_with(&mut ns, &mut [&mut peer], Some(&pool));
        for e in app.events() {
            match e {
                Event::DataAcked { ranges, .. } => acked += ranges.bytes(),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(Instant::now() < deadline, "timed out: {:?}", ns.stats());
    }
    assert_eq!(peer.got, want, "the peer got every byte, in order");
    let st = ns.stats();
    assert_eq!(st.tx_bytes_copied, 0, "the netstack copied payload: {st:?}");
    assert_eq!(st.tx_frames_unnamed, 0, "{st:?}");
    assert!(st.tx_bytes_zero_touch >= want.len() as u64, "{st:?}");
}
