//! A uthread that overflows its stack is reported by name, not left to
//! corrupt memory. The overflow runs in a child process (this same test
//! binary, re-executed) because it must abort.

use std::process::Command;

const CHILD_ENV: &str = "GINZA_TEST_STACK_OVERFLOW_CHILD";

#[inline(never)]
fn recurse(depth: u64) -> u64 {
    let pad = std::hint::black_box([depth; 64]);
    if depth == u64::MAX {
        return 0;
    }
    recurse(depth + 1) + pad[3]
}

#[test]
fn overflow_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return; // only meaningful when re-executed by the test below
    }
    let config = ginza_runtime::Config {
        stack_size: 64 * 1024,
        ..ginza_runtime::Config::with_kthreads(1)
    };
    let _ = ginza_runtime::run(config, || ginza_runtime::spawn(|| recurse(0)).join());
    unreachable!("the overflow should have aborted the process");
}

#[test]
fn stack_overflow_is_reported() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "overflow_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "child survived an overflow: {stderr}"
    );
    assert!(
        stderr.contains("ginza: uthread stack overflow on kthread 0 (stack of 65536 bytes"),
        "no overflow report in: {stderr}"
    );
}
