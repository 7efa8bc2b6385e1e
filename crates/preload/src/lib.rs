//! `ginza run`: the preload library that makes an unmodified, dynamically
//! linked C or C++ program a Ginza application (docs/preload.md).
//!
//! Loaded with `LD_PRELOAD`, it takes over `__libc_start_main`, starts a
//! Ginza runtime (standalone, or registered with iokerneld) and runs the
//! program's `main` and every thread it creates as uthreads. Each program
//! thread keeps a glibc thread control block of its own, so `errno`,
//! `__thread` variables, malloc's per-thread caches and stdio locks stay
//! with the thread wherever it runs (`tcb.rs`, `mode.rs`). The pthread
//! synchronization objects and sleeps are served by the runtime: a waiting
//! thread suspends only itself, and an idle runtime gives its cores back.
//!
//! One mechanism a file: `mode.rs` (who is calling, and the switch of
//! thread pointer between C code and the runtime), `tcb.rs` (thread control
//! blocks), `lot.rs` (waiting by address), `blocking.rs` (system calls that would block, run on a pool), `thread.rs`, `key.rs` (keys and
//! once), `mutex.rs`, `cond.rs`, `rwlock.rs`, `barrier.rs`, `spin.rs`,
//! `sem.rs`, `preempt_at.rs` (where a program thread may be preempted), `setxid.rs` (setuid and kin), `time.rs` (sleeps and yield), `signal.rs` (the program's
//! signal handlers), `process.rs` (fork), `start.rs` (the runtime and
//! `main`), `running.rs` (whether it runs), `capi.rs` (`include/ginza.h`), `net_stats_file.rs` (the network counters written at exit, `GINZA_NET_STATS`), `config.rs` (the environment
//! `ginza run` sets) and `say.rs` (one line per unsupported call).
//!
//! Sockets: `gsock.rs` (the Ginza socket object), `socket.rs` (AF_INET
//! sockets on the program's Ginza address: making, naming, connecting,
//! options, closing), `sockio.rs` (reading and writing them), `fdtable.rs`
//! (which descriptor numbers are Ginza's), `epoll.rs`, `epoll_calls.rs` and
//! `pollset.rs` (readiness over Ginza sockets and kernel descriptors
//! together), `kwatch.rs` (kernel descriptors watched by a pool thread
//! while a program thread waits on both) and `wait_mask.rs` (the signal
//! mask of `ppoll`, `pselect` and `epoll_pwait` while they wait).
#![deny(unsafe_op_in_unsafe_fn)]
// Every exported function is called by C with C's contract; each documents
// what it assumes in its SAFETY comments rather than in a `# Safety` section.
#![allow(clippy::missing_safety_doc)]

mod barrier;
mod blocking;
mod capi;
mod cond;
mod config;
mod epoll;
mod epoll_calls;
mod epoll_watch;
mod exit_linger;
mod fdtable;
mod gsock;
mod key;
mod kwatch;
mod lot;
mod mode;
mod mutex;
mod net_stats_file;
mod pollset;
mod preempt_at;
mod process;
mod running;
mod rwlock;
mod say;
mod sem;
mod setxid;
mod signal;
mod socket;
mod sockio;
mod spin;
mod start;
mod tcb;
mod thread;
mod time;
mod wait_mask;
