//! A Ginza application on a thread of its own, for the tests (shared by
//! `common` and `http_scan_common`).

use std::time::{Duration, Instant};

use ginza_runtime::{Config, RuntimeError};

/// A Ginza runtime on its own thread.
pub struct App<T> {
    thread: std::thread::JoinHandle<Result<T, RuntimeError>>,
}

impl<T: Send + 'static> App<T> {
    /// Runs `main` on a runtime of `config` on a thread of its own.
    pub fn spawn(config: Config, main: impl FnOnce() -> T + Send + 'static) -> App<T> {
        App {
            thread: std::thread::spawn(move || ginza_runtime::run(config, main)),
        }
    }
}

impl<T> App<T> {
    /// Waits (at most `limit`) for `main` to return and gives its value.
    pub fn join(self, limit: Duration) -> T {
        let t0 = Instant::now();
        while !self.thread.is_finished() {
            assert!(
                t0.elapsed() < limit,
                "the Ginza application is still running after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        self.thread
            .join()
            .expect("the runtime thread")
            .expect("the runtime")
    }

    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }
}
