//! What the kv-server tests against real memcached share: a scripted
//! sequence of raw text-protocol requests (well-formed and malformed, meta
//! commands included), a
//! runner that sends them over any byte stream and cuts the replies, what
//! is masked before comparing, and Debian's `memcached` as a child process.
#![allow(dead_code)] // each test binary uses a part

use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// How one step's reply ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// The runner appends `mn\r\n`; the reply is what comes before `MN\r\n`.
    Mn,
    /// The server closes the connection; the reply is all it sent.
    Closed,
}

#[derive(Debug, Clone)]
pub struct Step {
    pub send: Vec<u8>,
    pub until: Until,
}

fn step(send: impl AsRef<[u8]>) -> Step {
    Step {
        send: send.as_ref().to_vec(),
        until: Until::Mn,
    }
}

fn closing(send: impl AsRef<[u8]>) -> Step {
    Step {
        send: send.as_ref().to_vec(),
        until: Until::Closed,
    }
}

/// The script: sessions (one connection each) of steps. Nothing in it
/// depends on time passing (no relative TTL is waited out), and no reply
/// contains "MN\r\n" but the marker's.
pub fn script() -> Vec<Vec<Step>> {
    let long_key = "k".repeat(251);
    let max_key = "m".repeat(250);
    let big = 2_000_000;
    let mut too_large = format!("set big 0 0 {big}\r\n").into_bytes();
    too_large.extend(std::iter::repeat_n(b'z', big));
    too_large.extend_from_slice(b"\r\n");
    let mut main = vec![
        // Storage and retrieval.
        step("set a 0 0 1\r\n1\r\n"),
        step("get a\r\n"),
        step("get a nokey a\r\n"),
        step("gets a\r\n"),
        step("add a 0 0 1\r\nx\r\n"),
        step("add b 5 0 2\r\nbb\r\n"),
        step("replace nokey 0 0 1\r\nx\r\n"),
        step("replace b 6 0 3\r\nbbb\r\n"),
        step("append b 9 0 2\r\n++\r\n"),
        step("prepend b 9 0 2\r\n--\r\n"),
        step("get b\r\n"),
        step("append nokey 0 0 1\r\nx\r\n"),
        step("prepend nokey 0 0 1\r\nx\r\n"),
        step("set empty 0 0 0\r\n\r\nget empty\r\n"),
        step(b"set bin 0 0 4\r\n\r\n\0\xff\r\nget bin\r\n"),
        // incr/decr.
        step("incr a 5\r\n"),
        step("decr a 10\r\n"),
        step("incr a 18446744073709551615\r\n"),
        step("incr a 2\r\n"),
        step("set n 0 0 2\r\n10\r\ndecr n 1\r\nget n\r\n"),
        step("incr n 100\r\nget n\r\n"),
        step("set sp 0 0 4\r\n12 x\r\nincr sp 1\r\nget sp\r\n"),
        step("incr b 1\r\n"),
        step("incr empty 1\r\n"),
        step("incr nokey 1\r\n"),
        step("incr a x\r\n"),
        step("incr a -1\r\n"),
        step("decr a\r\n"),
        step("incr a 1 2 3\r\n"),
        // touch and get-and-touch.
        step("touch a 100\r\n"),
        step("touch nokey 100\r\n"),
        step("touch a x\r\n"),
        step("gat 100 a b nokey\r\n"),
        step("gat 0 a\r\n"),
        step("gat x a\r\n"),
        step("gat 10\r\n"),
        step("gat\r\n"),
        // delete.
        step("delete a\r\n"),
        step("delete a\r\n"),
        step("set a 0 0 1\r\n1\r\ndelete a 0\r\n"),
        step("delete b 1\r\n"),
        step("delete b noreply\r\nget b\r\n"),
        step("delete x 0 noreply\r\n"),
        step("delete x 0 1\r\n"),
        step("delete\r\n"),
        // cas: a miss, a mismatch, a malformed unique.
        step("cas nokey 0 0 1 1\r\nx\r\n"),
        step("set c 0 0 1\r\nc\r\n"),
        step("cas c 0 0 1 987654321\r\nx\r\n"),
        step("cas c 0 0 1 abc\r\nx\r\n"),
        step("cas c 0 0 1\r\n"),
        step("get c\r\n"),
        // noreply, also on errors.
        step("set q 0 0 1 noreply\r\nq\r\nget q\r\n"),
        step("add q 0 0 1 noreply\r\nz\r\nget q\r\n"),
        step("incr q 1 noreply\r\n"),
        step("set q 0 0 x noreply\r\nq\r\n"),
        step("touch q 10 noreply\r\n"),
        // Flags as memcached reads them.
        step("set f 4294967295 0 1\r\nf\r\nget f\r\n"),
        step("set f 4294967296 0 1\r\nf\r\nget f\r\n"),
        step("set f -1 0 1\r\nf\r\n"),
        step("set f x 0 1\r\nf\r\n"),
        step("set f 0 x 1\r\nf\r\n"),
        step("set f 0 0 -1\r\n"),
        step("set f 0 0 1x\r\nf\r\n"),
        // Expiration: negative, and absolute times in the past.
        step("set e 0 -1 1\r\ne\r\nget e\r\n"),
        step("set e 0 1000000000 1\r\ne\r\nget e\r\n"),
        step("set e 0 100 1\r\ne\r\ntouch e -1\r\nget e\r\n"),
        step("set e 0 0 1\r\ne\r\ngat -1 e\r\nget e\r\n"),
        // Keys: 250 bytes is the limit; tabs belong to keys.
        step(format!("set {max_key} 0 0 1\r\nm\r\nget {max_key}\r\n")),
        step(format!("set {long_key} 0 0 1\r\nm\r\n")),
        step(format!("get a {long_key}\r\n")),
        step(format!("delete {long_key}\r\n")),
        step(format!("incr {long_key} 1\r\n")),
        step(format!("touch {long_key} 1\r\n")),
        step("set t\tx 0 0 1\r\nt\r\nget t\tx\r\nget t\r\n"),
        // Lines: a bare "\n" ends one; several spaces separate tokens.
        step("get   a   c\n"),
        step("set  sp2  0  0  1 \r\ns\r\nget sp2\r\n"),
        // Malformed commands.
        step("\r\n"),
        step("\n"),
        step("bogus\r\n"),
        step("GET a\r\n"),
        step("get\r\n"),
        step("gets\r\n"),
        step("set a 0 0\r\n"),
        step("set a 0 0 1 2 3\r\n"),
        step("sets a\r\n"),
        step("x\r\n"),
        step("verbosity\r\n"),
        step("verbosity 1\r\n"),
        step("verbosity x\r\n"),
        step("verbosity 1 noreply\r\n"),
        step("flush_all x\r\n"),
        step("flush_all 1 2 3\r\n"),
        // Bad data chunks: the bytes after the block are the next line.
        step("set a 0 0 3\r\nabcde\r\n"),
        step("set a 0 0 1\r\nabc\r\n"),
        step("get a\r\n"),
        // Too large: refused, its data swallowed, the old item removed.
        step("set big 0 0 1\r\nb\r\n"),
        step(too_large),
        step("get big\r\n"),
        // flush_all.
        step("flush_all\r\n"),
        step("get q f c sp2\r\n"),
        step("set z 0 0 1\r\nz\r\nflush_all noreply\r\nget z\r\n"),
        step("flush_all 0\r\n"),
    ];
    main.extend(meta_steps(&long_key));
    // The last step closes.
    main.last_mut().expect("steps").until = Until::Closed;
    let mut long_get = b"get".to_vec();
    for i in 0..20 {
        long_get.extend_from_slice(format!(" {}{i}", "g".repeat(190)).as_bytes());
    }
    long_get.extend_from_slice(b"\r\n");
    vec![
        main,
        vec![closing("quit\r\n")],
        vec![step("set h 0 0 1\r\nh\r\n"), closing("GET / HTTP/1.1\r\n")],
        vec![step("version\r\n"), closing(vec![b'x'; 3000])],
        vec![step(long_get)],
        vec![
            step("set kk 0 0 5\r\nhello\r\n"),
            closing("get kk\r\nquit\r\n"),
        ],
    ]
}

/// The main session's meta-command steps (after the classic ones);
/// `long_key` is one byte over the limit.
fn meta_steps(long_key: &str) -> Vec<Step> {
    vec![
        // Meta commands.
        step("ms mk 2\r\nhi\r\n"),
        step("ms mk 2 c k Oabc T0 F5\r\nhi\r\n"),
        step("mg mk v f s k Oop t\r\n"),
        step("mg mk\r\n"),
        step("mg mk c\r\n"),
        step("mg mk q v\r\n"),
        step("mg nokey v\r\n"),
        step("mg nokey v q\r\n"),
        step("mg nokey k Ox\r\n"),
        step("mg mk v v\r\n"),
        step("mg mk !\r\n"),
        step("mg mk Tabc\r\n"),
        step("mg\r\n"),
        step("mg mk T100 t\r\n"),
        step(format!("mg {long_key} v\r\n")),
        step("ms mk 2 MX\r\nhi\r\n"),
        step("ms mk 2 ME\r\nhi\r\n"),
        step("ms mnew 2 ME\r\nhi\r\n"),
        step("ms mk 2 MA\r\n!!\r\nmg mk v\r\n"),
        step("ms mk 1 MP\r\n<\r\nmg mk v\r\n"),
        step("ms nokey2 1 MR\r\nx\r\n"),
        step("ms mk 2 C1\r\nhi\r\n"),
        step("ms nokey3 2 C1\r\nhi\r\n"),
        step("ms mk 2 q\r\nhi\r\n"),
        step("ms mk 2 q ME\r\nhi\r\n"),
        step("ms mk x\r\n"),
        step("ms mk\r\n"),
        step("ms mk 2 v v\r\nhi\r\n"),
        step("ms mk 2 MEE\r\nhi\r\n"),
        step("ms mk 3\r\nabcde\r\n"),
        step("ms mk 2 Fx\r\nhi\r\n"),
        step("md mk\r\n"),
        step("md mk\r\n"),
        step("md mk q\r\n"),
        step("md mnew q\r\nmg mnew\r\n"),
        step("md x Oab k\r\n"),
        step("md x v v\r\n"),
        step("md\r\n"),
        step("mz x\r\n"),
        step("ma cnt\r\n"),
        step("ma cnt N0 J10 v\r\n"),
        step("ma cnt v\r\n"),
        step("ma cnt D5 MD v k Oo t\r\n"),
        step("ma cnt D100 M- v\r\n"),
        step("ma cnt q\r\nmg cnt v\r\n"),
        step("ma cnt MX\r\n"),
        step("ma cnt Dx\r\n"),
        step("ma cnt v v\r\n"),
        step("ma cnt C1 v\r\n"),
        step("ma mk\r\n"),
        step("ma nokey4 q\r\n"),
        step("ma cnt T100 t v\r\n"),
        // `b`: the key token is base64 ("binkey", "bcnt"); never used
        // plain (memcached's items remember a base64 key, ours do not).
        step("ms Ymlua2V5 2 b\r\nhi\r\n"),
        step("mg Ymlua2V5 b v k\r\n"),
        step("mg Ymlua2V5 b k O1 c s\r\n"),
        step("mg Ymlua2V5 k b t\r\n"),
        step("mg Ymlua2V5== b v\r\n"),
        step("mg abc b v\r\n"),
        step("mg !!!! b v k\r\n"),
        step("ms abc 2 b\r\nhi\r\n"),
        step("ms abc 2 b q\r\nhi\r\n"),
        step("ma YmNudA== b N0 J5 v k\r\n"),
        step("ma YmNudA== b v\r\n"),
        step("md Ymlua2V5 b k q\r\nmg Ymlua2V5 b v k\r\n"),
        step("md Ymlua2V5 b k\r\n"),
        step("md Ymlua2V5 b b\r\n"),
        // N (vivify on miss) and R (recache): the W flag once per item,
        // then Z, until the item is replaced.
        step("mg nv1 N30 v c t\r\n"),
        step("mg nv1 N30 v c t\r\n"),
        step("mg nv1 v\r\n"),
        step("ms nv1 2 T60\r\nhi\r\n"),
        step("mg nv1 v t\r\n"),
        step("mg nv1 R100 v t\r\n"),
        step("mg nv1 R100 v t\r\n"),
        step("mg nv1 R10 v t\r\n"),
        step("mg nv2 N30 q\r\n"),
        step("mg nv2 N30 q\r\n"),
        step("mg nv2 N30 k s f\r\n"),
        step("mg nv3 N30 v q\r\n"),
        step("mg nv4 R30 v\r\n"),
        step("ms nv5 2\r\nhi\r\n"),
        step("mg nv5 R30 v t\r\n"),
        step("ms nv6 2 T60\r\nhi\r\n"),
        step("mg nv6 R30 v\r\n"),
        step("mg nvx Nabc v\r\n"),
        step("mg nvx Rabc v\r\n"),
        step("mg nvx N-1 v\r\n"),
        step("mg nvx N-1 v\r\n"),
        step("mg nvx N30 N30 v\r\n"),
        step("version\r\n"),
        step("get a\r\nquit\r\n"),
    ]
}

/// Runs the script on connections `connect` makes; the replies of every
/// step, session by session.
pub fn run_script<S: Read + Write>(
    script: &[Vec<Step>],
    mut connect: impl FnMut() -> S,
) -> Vec<Vec<Vec<u8>>> {
    script
        .iter()
        .map(|session| {
            let mut s = connect();
            session.iter().map(|step| exchange(&mut s, step)).collect()
        })
        .collect()
}

/// The longest wait for one reply.
pub const REPLY_WAIT: Duration = Duration::from_secs(10);

/// Sends one step and reads its reply.
pub fn exchange<S: Read + Write>(s: &mut S, step: &Step) -> Vec<u8> {
    let mut send = step.send.clone();
    if step.until == Until::Mn {
        send.extend_from_slice(b"mn\r\n");
    }
    s.write_all(&send).expect("sending a step");
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    let t0 = Instant::now();
    loop {
        if step.until == Until::Mn && reply.ends_with(b"MN\r\n") {
            reply.truncate(reply.len() - 4);
            return reply;
        }
        assert!(
            t0.elapsed() < REPLY_WAIT,
            "no whole reply to {:?} after {REPLY_WAIT:?}; so far {:?}",
            String::from_utf8_lossy(&step.send[..step.send.len().min(200)]),
            String::from_utf8_lossy(&reply)
        );
        match s.read(&mut buf) {
            Ok(0) => {
                assert_eq!(
                    step.until,
                    Until::Closed,
                    "the server closed after {:?}; so far {:?}",
                    String::from_utf8_lossy(&step.send[..step.send.len().min(200)]),
                    String::from_utf8_lossy(&reply)
                );
                reply.extend_from_slice(b"<closed>");
                return reply;
            }
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if step.until == Until::Closed && e.kind() == ErrorKind::ConnectionReset => {
                reply.extend_from_slice(b"<closed>");
                return reply;
            }
            Err(e) => panic!("reading a reply: {e}"),
        }
    }
}

/// What legitimately differs between two servers, masked: the cas unique
/// of `gets`/`gats` lines and of meta replies' `c` flag, and the version
/// string.
pub fn mask(reply: &[u8]) -> String {
    let text = String::from_utf8_lossy(reply);
    text.split_inclusive("\r\n")
        .map(|line| {
            if line.starts_with("VERSION ") {
                return "VERSION <masked>\r\n".to_string();
            }
            let words: Vec<&str> = line.trim_end_matches("\r\n").split(' ').collect();
            if words.len() == 5 && words[0] == "VALUE" {
                return format!("VALUE {} {} {} <cas>\r\n", words[1], words[2], words[3]);
            }
            // Meta replies: the `c` flag's cas unique.
            if ["HD", "VA", "EN", "NS", "EX", "NF"].contains(&words[0]) {
                let masked: Vec<String> = words
                    .iter()
                    .map(|w| {
                        if w.len() > 1
                            && w.starts_with('c')
                            && w[1..].bytes().all(|b| b.is_ascii_digit())
                        {
                            "c<cas>".to_string()
                        } else {
                            w.to_string()
                        }
                    })
                    .collect();
                return format!("{}\r\n", masked.join(" "));
            }
            line.to_string()
        })
        .collect()
}

/// Whether two masked replies say the same, but that a meta reply's
/// remaining time to live (`t` flag) may be one second apart: a second
/// boundary may fall between a set and a later read in one run and not in
/// the other (a loaded machine makes that likely).
fn same_but_a_ttl_tick(a: &str, b: &str) -> bool {
    let ttl = |w: &str| w.strip_prefix('t').and_then(|n| n.parse::<i64>().ok());
    let words = |s: &str| -> Vec<Vec<String>> {
        s.split("\r\n")
            .map(|l| l.split(' ').map(str::to_string).collect())
            .collect()
    };
    let (la, lb) = (words(a), words(b));
    la.len() == lb.len()
        && la.iter().zip(&lb).all(|(wa, wb)| {
            wa.len() == wb.len()
                && wa.iter().zip(wb).all(|(x, y)| {
                    x == y
                        || matches!((ttl(x), ttl(y)),
                            (Some(p), Some(q)) if p > 0 && q > 0 && (p - q).abs() == 1)
                })
        })
}

#[test]
fn a_ttl_may_be_one_second_apart_and_nothing_else() {
    assert!(same_but_a_ttl_tick(
        "VA 2 t30 c<cas>\r\nhi\r\n",
        "VA 2 t29 c<cas>\r\nhi\r\n"
    ));
    assert!(!same_but_a_ttl_tick(
        "VA 2 t30\r\nhi\r\n",
        "VA 2 t28\r\nhi\r\n"
    ));
    assert!(!same_but_a_ttl_tick(
        "VA 2 t30\r\nhi\r\n",
        "VA 2 t29\r\nho\r\n"
    ));
    assert!(!same_but_a_ttl_tick("HD t-1\r\n", "HD t0\r\n"));
    assert!(!same_but_a_ttl_tick("VA 2 s31\r\n", "VA 2 s30\r\n"));
}

/// Compares two runs step by step; the first difference fails the test.
pub fn assert_same(script: &[Vec<Step>], ours: &[Vec<Vec<u8>>], theirs: &[Vec<Vec<u8>>]) {
    for (i, session) in script.iter().enumerate() {
        for (j, step) in session.iter().enumerate() {
            let (a, b) = (mask(&ours[i][j]), mask(&theirs[i][j]));
            assert!(
                a == b || same_but_a_ttl_tick(&a, &b),
                "session {i} step {j}: {:?}\n  kv-server: {a:?}\n  memcached: {b:?}",
                String::from_utf8_lossy(&step.send[..step.send.len().min(120)])
            );
        }
    }
}

/// Debian's memcached as a child process; killed on drop.
pub struct Memcached {
    pub child: Child,
    /// Where it was told to listen, for messages.
    listen: String,
    /// Where its standard error goes, removed on drop.
    stderr: PathBuf,
    /// The file it names its port in, if told to (and its `.lck` draft);
    /// removed on drop.
    port_file: Option<PathBuf>,
}

impl Drop for Memcached {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A test that failed against memcached says whether memcached
            // was still running and what it wrote.
            let status = self.child.try_wait();
            let said = std::fs::read_to_string(&self.stderr).unwrap_or_default();
            eprintln!(
                "memcached on {}: exit status {status:?} (None: still running); its stderr: {said:?}",
                self.listen
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stderr);
        if let Some(file) = &self.port_file {
            let _ = std::fs::remove_file(file);
            let _ = std::fs::remove_file(file.with_extension("ports.lck"));
        }
    }
}

impl Memcached {
    /// Starts `command` (memcached), its standard error going to a file.
    fn spawn(mut command: Command, listen: String, port_file: Option<PathBuf>) -> Memcached {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let stderr = std::env::temp_dir().join(format!(
            "ginza-test-memcached-{}-{}.stderr",
            std::process::id(),
            STARTED.fetch_add(1, Relaxed)
        ));
        let file = std::fs::File::create(&stderr).expect("memcached's stderr file");
        command.stdout(Stdio::null()).stderr(file);
        let child = command.spawn().expect("starting memcached");
        Memcached {
            child,
            listen,
            stderr,
            port_file,
        }
    }

    /// Waits until `ready` gives a value; fails the test if memcached
    /// exits first or `REPLY_WAIT` passes.
    fn wait_for<T>(&mut self, what: &str, mut ready: impl FnMut() -> Option<T>) -> T {
        let t0 = Instant::now();
        loop {
            if let Some(value) = ready() {
                return value;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "memcached on {} exited ({status}) before it {what}",
                    self.listen
                );
            }
            assert!(
                t0.elapsed() < REPLY_WAIT,
                "memcached on {} did not {what} within {REPLY_WAIT:?}",
                self.listen
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The memcached binary, if installed.
pub fn memcached_binary() -> Option<&'static str> {
    ["/usr/bin/memcached", "/usr/local/bin/memcached"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
}

/// The arguments that start memcached in the foreground on `listen:port`
/// (`-1`: a port the kernel picks), TCP only (as root it must be told a
/// user to run as).
pub fn memcached_args(listen: &str, port: impl std::fmt::Display) -> Vec<String> {
    let mut args = vec![
        "-l".to_string(),
        listen.to_string(),
        "-p".to_string(),
        port.to_string(),
        "-U".to_string(),
        "0".to_string(),
        "-t".to_string(),
        "1".to_string(),
    ];
    if ginza_iokernel::testing::running_as_root() {
        args.extend(["-u".to_string(), "root".to_string()]);
    }
    args
}

/// Starts `command` (memcached) and waits until `addr` accepts.
pub fn start_memcached(
    command: Command,
    addr: SocketAddrV4,
    connect: impl Fn() -> bool,
) -> Memcached {
    let mut m = Memcached::spawn(command, addr.to_string(), None);
    m.wait_for("accepted", || connect().then_some(()));
    m
}

/// Starts memcached on loopback, on a port the kernel picks: memcached
/// writes the port to `MEMCACHED_PORT_FILENAME`'s `.lck` draft and renames
/// it into place once it listens, so the file's arrival is the readiness
/// check and no other program can hold the port. (A port chosen here and
/// a connect as the check raced twice in CI: the check connected, the
/// test's next connect was refused with memcached running.)
pub fn start_memcached_on_loopback(binary: &str) -> (Memcached, SocketAddrV4) {
    static STARTED: AtomicUsize = AtomicUsize::new(0);
    let port_file = std::env::temp_dir().join(format!(
        "ginza-test-memcached-{}-{}.ports",
        std::process::id(),
        STARTED.fetch_add(1, Relaxed)
    ));
    let mut command = Command::new(binary);
    command
        .args(memcached_args("127.0.0.1", -1))
        .env("MEMCACHED_PORT_FILENAME", &port_file);
    let mut m = Memcached::spawn(command, "127.0.0.1".to_string(), Some(port_file.clone()));
    let port = m.wait_for("named its port", || {
        let named = std::fs::read_to_string(&port_file).ok()?;
        named
            .lines()
            .find_map(|line| line.strip_prefix("TCP INET: "))
            .map(|port| port.trim().parse::<u16>().expect("memcached's port file"))
    });
    let addr = SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port);
    m.listen = addr.to_string();
    (m, addr)
}
