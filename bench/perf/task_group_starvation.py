#!/usr/bin/env python3
"""Does this kernel starve other task groups beside Ginza's pattern of threads?

One session (one autogroup) runs, like iokerneld and two applications
started from one shell:
  * a thread busy on CPU 0 (iokerneld busy-polling);
  * on CPU 1, a thread always runnable (batch; SCHED_IDLE, nice 19 or
    nice 0 by --batch);
  * on CPU 1, a thread busy for --on-us then asleep for --off-us, over and
    over (a latency-critical kthread running and parking).
A probe in a session of its own, nice 0 on CPU 1 like the kernel's per-CPU
threads, wakes every millisecond. A SCHED_FIFO watcher on CPU 0 reports
the probe's longest wait for CPU 1. With --split the batch thread gets a
session of its own instead.

Run as root (the watcher is SCHED_FIFO) on a machine with two CPUs or
more; each run lasts --seconds. Standard library only.
docs/soak.md ("Findings", session 37) has the figures measured with it.
"""
import argparse
import multiprocessing as mp
import os
import time


def busy_on(cpu):
    os.sched_setaffinity(0, {cpu})
    while True:
        pass


def batch(cpu, kind):
    os.sched_setaffinity(0, {cpu})
    if kind == "idle":
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    elif kind == "nice19":
        os.setpriority(os.PRIO_PROCESS, 0, 19)
    while True:
        pass


def on_off(cpu, on_s, off_s):
    os.sched_setaffinity(0, {cpu})
    while True:
        until = time.monotonic() + on_s
        while time.monotonic() < until:
            pass
        time.sleep(off_s)


def session(args, split_pid):
    """The shared session: forks its members and becomes the batch thread
    (with --split, forks it into a session of its own)."""
    os.setsid()
    if os.fork() == 0:
        busy_on(0)
    if os.fork() == 0:
        on_off(1, args.on_us / 1e6, args.off_us / 1e6)
    if not args.split:
        batch(1, args.batch)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        batch(1, args.batch)
    split_pid.value = pid
    while True:
        time.sleep(1)


def probe(beat):
    os.setsid()
    os.sched_setaffinity(0, {1})
    while True:
        time.sleep(0.001)
        beat.value = time.monotonic()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", choices=["idle", "nice19", "other"], default="idle")
    p.add_argument("--on-us", type=float, default=50)
    p.add_argument("--off-us", type=float, default=50)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--split", action="store_true")
    args = p.parse_args()
    beat = mp.Value("d", 0.0, lock=False)
    split_pid = mp.Value("i", 0, lock=False)
    group = mp.Process(target=session, args=(args, split_pid))
    group.start()
    prober = mp.Process(target=probe, args=(beat,))
    prober.start()
    os.sched_setaffinity(0, {0})
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    start = time.monotonic()
    beat.value = start
    longest = stalled = 0.0
    try:
        while time.monotonic() - start < args.seconds:
            time.sleep(0.01)
            wait = time.monotonic() - beat.value
            longest = max(longest, wait)
            stalled += 0.01 if wait > 0.05 else 0.0
    finally:
        for leader in (group.pid, prober.pid, split_pid.value):
            if leader:
                os.killpg(leader, 9)
    print(
        f"batch {args.batch}{' (own session)' if args.split else ''}, on {args.on_us} us / "
        f"off {args.off_us} us: the probe's longest wait {longest * 1e3:.0f} ms, "
        f"{stalled:.2f} s of {args.seconds:g} s in waits over 50 ms"
    )


if __name__ == "__main__":
    main()
