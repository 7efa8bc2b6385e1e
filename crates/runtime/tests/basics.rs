//! uthreads: spawn/join at scale, nesting, panics, yield.

use ginza_runtime::{run, spawn, yield_now, Config, JoinError};

#[test]
fn hundred_thousand_uthreads_return_their_values() {
    let sum = run(Config::with_kthreads(2), || {
        let handles: Vec<_> = (0..100_000u64).map(|i| spawn(move || i * 3)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
    })
    .unwrap();
    assert_eq!(sum, 3 * (100_000u64 * 99_999 / 2));
}

#[test]
fn nested_spawns_join_through_three_levels() {
    let total = run(Config::with_kthreads(3), || {
        let outer: Vec<_> = (0..20u64)
            .map(|i| {
                spawn(move || {
                    let mid: Vec<_> = (0..10u64)
                        .map(|j| spawn(move || spawn(move || i * 100 + j).join().unwrap()))
                        .collect();
                    mid.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
                })
            })
            .collect();
        outer.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
    })
    .unwrap();
    let expected: u64 = (0..20u64)
        .flat_map(|i| (0..10u64).map(move |j| i * 100 + j))
        .sum();
    assert_eq!(total, expected);
}

#[test]
fn a_panic_in_a_uthread_comes_back_through_join() {
    let (message, survivor) = run(Config::with_kthreads(2), || {
        let bad = spawn(|| -> u32 { panic!("request 17 was malformed") });
        let good = spawn(|| 5u32);
        let err = bad.join().unwrap_err();
        let JoinError::Panicked { message, .. } = err;
        (message, good.join().unwrap())
    })
    .unwrap();
    assert_eq!(message, "request 17 was malformed");
    assert_eq!(survivor, 5);
}

#[test]
fn a_panic_in_main_is_an_error_of_run() {
    let err = run(Config::with_kthreads(1), || -> () {
        panic!("main gave up")
    })
    .unwrap_err();
    assert!(err.to_string().contains("main gave up"), "{err}");
}

#[test]
fn yield_interleaves_uthreads_on_one_kthread() {
    let log = run(Config::with_kthreads(1), || {
        let log = std::sync::Arc::new(ginza_runtime::Mutex::new(Vec::new()));
        let hs: Vec<_> = (0..2)
            .map(|id| {
                let log = log.clone();
                spawn(move || {
                    for step in 0..3 {
                        log.lock().push((id, step));
                        yield_now();
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        let v = log.lock().clone();
        v
    })
    .unwrap();
    assert_eq!(log, vec![(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]);
}

#[test]
fn invalid_config_is_an_error_not_a_panic() {
    let err = run(Config::with_kthreads(0), || ()).unwrap_err();
    assert!(err.to_string().contains("at least one kthread"), "{err}");
    let err = run(
        Config {
            cores: Some(vec![4096]),
            ..Config::default()
        },
        || (),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("core 4096 does not exist"),
        "{err}"
    );
}
