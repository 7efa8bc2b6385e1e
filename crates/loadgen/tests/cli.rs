//! The command line: `--help` documents every flag, bad flags get clear
//! errors (no panics, no backtraces), `--json` prints the report as one
//! JSON object.

mod common;

use std::process::{Command, Output};

use clap::{CommandFactory, Parser};
use ginza_loadgen::args::LoadgenArgs;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: LoadgenArgs,
}

fn loadgen(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn help_documents_every_flag() {
    let o = loadgen(&["--help"]);
    assert!(o.status.success());
    let help = String::from_utf8(o.stdout).unwrap();
    let command = Cli::command();
    let mut n = 0;
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        n += 1;
        assert!(
            help.contains(&format!("--{long}")),
            "--{long} missing from --help"
        );
        let doc = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        assert!(doc.len() > 10, "--{long} has no help text");
    }
    assert!(n >= 25, "only {n} flags");
}

#[test]
fn bad_flags_say_what_is_wrong() {
    let cases: &[(&[&str], &str)] = &[
        (&["--rate", "abc"], "not a rate"),
        (&["--transport", "sctp"], "possible values"),
        (&["--steps", "5"], "RATE:DURATION"),
        (&["--duration", "5 fortnights"], "unit"),
        (&["--service", "gauss:5us"], "not a service time"),
        (&["--rate", "1k", "--steps", "1k:1s"], "cannot be used with"),
        (&[], "--target HOST:PORT is required"),
        (&["-t", "nowhere"], "not HOST:PORT"),
        (&["-t", "127.0.0.1:9", "--protocol", "http"], "TCP only"),
        (
            &["-t", "127.0.0.1:9", "--connections", "0"],
            "at least one connection",
        ),
        (
            &["-t", "127.0.0.1:9", "--warmup", "2s", "--duration", "1s"],
            "nothing",
        ),
        (&["-t", "127.0.0.1:9", "--size", "3"], "--size at least 8"),
        (
            &[
                "-t",
                "127.0.0.1:9",
                "--protocol",
                "memcached",
                "--keys",
                "0",
            ],
            "key population",
        ),
        (
            &["-t", "127.0.0.1:9", "--rate", "1e12", "--duration", "10s"],
            "at most",
        ),
        (
            &[
                "-t",
                "127.0.0.1:9",
                "--transport",
                "tcp",
                "--duration",
                "100ms",
            ],
            "refused",
        ),
    ];
    for (args, expect) in cases {
        let o = loadgen(args);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(expect), "{args:?}: {err:?} lacks {expect:?}");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
}

#[test]
fn json_output_is_one_report() {
    let server = common::UdpEcho::start(false);
    let target = server.addr.to_string();
    let o = loadgen(&[
        "-t",
        &target,
        "--rate",
        "500",
        "--duration",
        "300ms",
        "--json",
        "--arrivals",
        "constant",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["protocol"], "echo");
    assert_eq!(v["transport"], "udp");
    assert_eq!(v["backend"], "kernel");
    assert_eq!(v["sent"], 150);
    assert_eq!(v["completed"], 150);
    assert_eq!(v["offered_rps"], 500.0);
    for key in ["p50_us", "p99_us", "p999_us"] {
        assert!(v["classes"]["echo"][key].as_f64().unwrap() > 0.0, "{key}");
    }
    assert!(v["generator_saturated"].is_boolean());
    assert!(v["send_lag"]["p99_us"].is_number());
}
