//! `http-server --protected-async`: the same HTTP sessions as
//! [`http_server`](crate::http_server), served by one event loop over the
//! protected netstack's raw events and commands
//! (`ginza_runtime::net::protected::Channel`, docs/runtime.md, "Protected
//! mode") instead of a uthread per connection: requests are parsed straight
//! from the read-only receive memory (no copy into a socket buffer),
//! responses copied once into the tx pool and sent by offset.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::SystemTime;

use ginza_runtime::net::protected::{Channel, Command, ConnId, Event};

use crate::http_server::{write_responses, HttpStats, Session};
use crate::serve::STOP_POLL;

/// One connection of the loop.
struct Conn {
    pair: usize,
    session: Session,
    /// Response bytes not yet in the tx pool (it was full).
    out: Vec<u8>,
    /// We shut down writing once `out` drains (the session closed).
    closing: bool,
    shut: bool,
}

/// Serves HTTP on TCP `port` of the netstack until `stop` is set. Must run
/// on a uthread of a runtime in protected mode, before any socket is made.
pub fn serve_async(port: u16, stop: Arc<AtomicBool>, stats: Arc<HttpStats>) -> io::Result<()> {
    let ch = Channel::open()?;
    let cookie = ch.cookie();
    ch.submit(
        0,
        &Command::Listen {
            cookie,
            port,
            backlog: 1024,
        },
    )?;
    let mut conns: HashMap<u32, Conn> = HashMap::new();
    let mut next_pair = 0usize;
    while !stop.load(Relaxed) {
        let Some(e) = ch.next_event(Some(STOP_POLL))? else {
            continue;
        };
        match e.event {
            Event::Listening { .. } => {
                log::info!("listening on TCP port {port} (protected, async)")
            }
            Event::Refused {
                conn: None,
                cookie: c,
                reason,
                ..
            } if c == cookie => {
                return Err(io::Error::other(format!(
                    "the netstack refused to listen on TCP port {port}: {reason}"
                )));
            }
            Event::NewConn { conn, listener, .. } => {
                // Spread connections over the ring pairs.
                let pair = next_pair % ch.pairs();
                next_pair += 1;
                ch.submit(pair, &Command::Accept { conn, listener })?;
                stats.accepted.fetch_add(1, Relaxed);
                stats.open.fetch_add(1, Relaxed);
                conns.insert(
                    conn.get(),
                    Conn {
                        pair,
                        session: Session::new(),
                        out: Vec::new(),
                        closing: false,
                        shut: false,
                    },
                );
            }
            Event::NewData { conn, ranges } => {
                let Some(c) = conns.get_mut(&conn.get()) else {
                    continue;
                };
                c.session.set_date(SystemTime::now());
                for &r in ranges.as_slice() {
                    let Some(bytes) = ch.rx(r) else { continue };
                    let responses = c.session.feed(bytes);
                    let mut chunk = Vec::new();
                    let out = &mut c.out;
                    write_responses(&responses, &mut chunk, |full| {
                        out.extend_from_slice(full);
                        Ok(())
                    })?;
                    out.extend_from_slice(&chunk);
                    for r in &responses {
                        stats.count(r);
                    }
                }
                ch.submit(c.pair, &Command::RecvDone { conn, ranges })?;
                c.closing |= c.session.is_closed();
                flush(&ch, conn, c)?;
            }
            Event::DataAcked { conn, .. } => {
                if let Some(c) = conns.get_mut(&conn.get()) {
                    flush(&ch, conn, c)?;
                }
            }
            Event::RemoteClosed { conn } => {
                if let Some(c) = conns.get(&conn.get()) {
                    ch.submit(c.pair, &Command::Close { conn })?;
                }
            }
            Event::Refused { conn: Some(_), .. } => {
                stats.socket_errors.fetch_add(1, Relaxed);
            }
            Event::Cleanup { conn } if conns.remove(&conn.get()).is_some() => {
                stats.open.fetch_sub(1, Relaxed);
            }
            Event::Disconnected { reason } => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    format!("the netstack disconnected us: {reason}"),
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Moves what fits of `c.out` into the tx pool and sends it; shuts down
/// writing once a closing session has sent everything.
fn flush(ch: &Channel, conn: ConnId, c: &mut Conn) -> io::Result<()> {
    let mut sent = 0;
    while sent < c.out.len() {
        let n = ch.send(c.pair, conn, &c.out[sent..])?;
        if n == 0 {
            break; // the pool is full: `DataAcked` brings us back
        }
        sent += n;
    }
    c.out.drain(..sent);
    if c.out.capacity() > 64 * 1024 && c.out.is_empty() {
        c.out = Vec::new();
    }
    if c.closing && c.out.is_empty() && !c.shut {
        c.shut = true;
        ch.submit(c.pair, &Command::Shutdown { conn })?;
    }
    Ok(())
}
