#!/usr/bin/env python3
"""Where a `ginza bench memcached` point's requests wait, from a system-wide
perf trace of one point (docs/results.md, "Session 20: memcached on the
direct path").

Record one point (as root), then read it:

    perf record -m 64M -a -o point.data \
        -e sched:sched_switch,sched:sched_waking,xdp:xdp_redirect \
        -e syscalls:sys_enter_sendto,syscalls:sys_exit_sendto \
        -e syscalls:sys_enter_sendmsg -- \
        ginza bench memcached --json --loads 40k --rounds 1 --duration 2s \
        --systems ginza-direct --library-rounds 0
    perf script -i point.data -F comm,pid,tid,cpu,time,event,trace \
        | python3 bench/perf/request_phases.py

Threads are told apart by name: the generator (`loadgen-*`), iokerneld's
loop (`iokerneld`), the server (kv-server's kthreads `ginza-k*` in the
bench's process, or memcached's threads, under `ginza run` or not), batch
(`ginza-k*` of another process, or Linux's `linux-batch`), everything else
("other", its largest names listed). It prints:

* each CPU's time by role over the trace;
* wake-up latency (sched_waking to running) by role;
* who wakes the server;
* phases, each a distribution: a generator send (its `sendto`) while no
  server thread runs → the server running; the same from the frame's XDP
  redirect; from the first such frame to the generator leaving the CPU
  it sent from (the frame waits for that on the switch path: iokerneld
  shares that CPU), and from there to the server's wake, by who woke it
  (iokerneld, batch's kthread answering a local wake, or the generator's
  own send on the direct path); what CPU 0 ran between the frame and the
  wake; the server's first send system call after it ran → the generator
  running;
* with `syscalls:sys_exit_sendto` recorded too, how long each role's
  `sendto` calls took (iokerneld's are the NIC's transmit kicks, in which
  the kernel also runs the generator's receive of the reply).

The trace covers the whole point (set-up and the keys' preload too, a
small part of it); perf itself shows up as "other".
"""
import collections
import re
import sys

LINE = re.compile(r'^\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+([\w:]+):\s*(.*)$')


def fields(rest):
    return dict(re.findall(r'(\w+)=(\S+)', rest))


def quantile(v, q):
    if not v:
        return float('nan')
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def main():
    events = []
    tgid, main_comm, comms = {}, {}, {}
    for line in sys.stdin:
        m = LINE.match(line)
        if not m:
            continue
        comm, pid, tid, cpu, t, name, rest = m.groups()
        pid, tid, cpu, t = int(pid), int(tid), int(cpu), float(t)
        tgid[tid] = pid
        comms[tid] = comm
        if pid == tid:
            main_comm[pid] = comm
        events.append((t, cpu, tid, comm, name, rest))
    if not events:
        sys.exit("no events: was the trace recorded with the events above?")
    bench = next((tgid[e[2]] for e in events if e[3].startswith('loadgen')), None)

    def role(tid):
        c, g = comms.get(tid, '?'), tgid.get(tid)
        if tid == 0:
            return 'idle'
        if c.startswith('loadgen'):
            return 'generator'
        if c.startswith('iokerneld'):
            return 'iokerneld'
        if c == 'linux-batch':
            return 'batch'
        memcached = main_comm.get(g, '').startswith('memcached')
        if c.startswith('ginza-k'):
            return 'server' if g == bench or memcached else 'batch'
        if memcached or c.startswith('memcached') or c.startswith('mc-'):
            return 'server'
        if g == bench:
            return 'bench, other threads'
        return 'other'

    span = events[-1][0] - events[0][0]
    running = {}  # cpu -> (tid, since)
    by_role = collections.defaultdict(float)
    by_name = collections.defaultdict(float)
    waking = {}
    wake_latency = collections.defaultdict(list)
    wakers = collections.Counter()
    server_on = set()
    sends, frames = [], []
    send_to_run, frame_to_run, reply_to_generator = [], [], []
    notice, notice_cpu0 = collections.defaultdict(list), collections.defaultdict(float)
    frame_to_generator_off, generator_off_to_wake = [], collections.defaultdict(list)
    first_frame = generator_off = None
    sendto_since, sendto_time = {}, collections.defaultdict(list)
    reply = None
    into_idle = out_of_idle = 0
    for t, cpu, tid, comm, name, rest in events:
        if name == 'sched:sched_switch':
            f = fields(rest)
            prev, nxt = int(f['prev_pid']), int(f['next_pid'])
            into_idle += nxt == 0
            out_of_idle += prev == 0
            comms.setdefault(nxt, f.get('next_comm', '?'))
            if cpu in running:
                ptid, since = running[cpu]
                by_role[(cpu, role(ptid))] += t - since
                if role(ptid) in ('other', 'bench, other threads'):
                    by_name[(cpu, comms.get(ptid, '?'))] += t - since
                if cpu == 0 and first_frame is not None:
                    notice_cpu0[role(ptid)] += t - max(since, first_frame)
            if (first_frame is not None and generator_off is None
                    and role(prev) == 'generator' and cpu == frame_cpu):
                generator_off = t
                frame_to_generator_off.append(t - first_frame)
            running[cpu] = (nxt, t)
            server_on.discard(prev)
            if role(nxt) == 'server':
                server_on.add(nxt)
                send_to_run += [t - s for s in sends]
                frame_to_run += [t - s for s in frames]
                sends, frames = [], []
                # Woken or not (a poller), the frames are the server's now.
                first_frame = generator_off = None
            if nxt in waking:
                wake_latency[role(nxt)].append(t - waking.pop(nxt))
            if role(nxt) == 'generator' and reply is not None:
                reply_to_generator.append(t - reply)
                reply = None
        elif name == 'sched:sched_waking':
            woken = int(fields(rest)['pid'])
            waking.setdefault(woken, t)
            if role(woken) == 'server':
                wakers[role(tid)] += 1
                if first_frame is not None:
                    if 0 in running:
                        ptid, since = running[0]
                        notice_cpu0[role(ptid)] += t - max(since, first_frame)
                    notice[role(tid)].append(t - first_frame)
                    if generator_off is not None:
                        generator_off_to_wake[role(tid)].append(t - generator_off)
                    first_frame = generator_off = None
        elif name == 'xdp:xdp_redirect':
            if not server_on:
                frames.append(t)
                # Only the generator's sends: a frame redirected inside
                # iokerneld's transmit kick is the generator's ACK of a
                # reply, which needs no server.
                if first_frame is None and role(tid) == 'generator':
                    first_frame, frame_cpu = t, cpu
        elif name == 'syscalls:sys_exit_sendto':
            if tid in sendto_since:
                sendto_time[role(tid)].append(t - sendto_since.pop(tid))
        elif name.startswith('syscalls:sys_enter_'):
            if name == 'syscalls:sys_enter_sendto':
                sendto_since[tid] = t
            r = role(tid)
            if r == 'generator' and not server_on:
                sends.append(t)
            elif r == 'server' and reply is None:
                reply = t

    print(f"trace of {span:.3f} s, {len(events)} events")
    if out_of_idle < into_idle / 2:
        # Seen on the nested VM of session 24: the kernel's switches out
        # of the idle task are mostly missing from the trace, so an idle
        # span runs on to the next switch there and takes in the run of
        # whatever was woken.
        print(f"warning: {into_idle} switches into idle but only {out_of_idle} out of it "
              "were traced: idle shares below are upper bounds (read /proc/stat instead)")
    print("each CPU's time by role, % of the trace:")
    for c in sorted({c for c, _ in by_role}):
        row = sorted(((r, v) for (cc, r), v in by_role.items() if cc == c), key=lambda x: -x[1])
        print(f"  cpu{c}: " + ", ".join(f"{r} {100 * v / span:.1f}" for r, v in row))
        names = sorted(((n, v) for (cc, n), v in by_name.items() if cc == c), key=lambda x: -x[1])
        if names:
            print("    of which: " + ", ".join(f"{n} {100 * v / span:.1f}" for n, v in names[:6]))
    print("wake-up latency (waking -> running), µs: role, wakes, p50, p99, p99.9")
    for r, v in sorted(wake_latency.items()):
        print(f"  {r}: {len(v)}, {1e6 * quantile(v, .5):.1f}, {1e6 * quantile(v, .99):.1f}, "
              f"{1e6 * quantile(v, .999):.1f}")
    print("who wakes the server:", dict(wakers))
    print("phases, µs: n, p50, p90, p99, p99.9")
    phases = [
        ("generator send, no server thread running -> server running", send_to_run),
        ("frame redirected (XDP), no server thread running -> server running", frame_to_run),
        ("first such frame -> the generator leaves its CPU", frame_to_generator_off),
    ]
    phases += [(f"first such frame -> {w} wakes the server", v) for w, v in sorted(notice.items())]
    phases += [(f"the generator left its CPU -> {w} wakes the server", v)
               for w, v in sorted(generator_off_to_wake.items())]
    phases += [("server's first send system call -> generator running", reply_to_generator)]
    phases += [(f"{r}'s sendto calls, enter -> exit", v) for r, v in sorted(sendto_time.items())]
    for label, v in phases:
        print(f"  {label}: {len(v)}, {1e6 * quantile(v, .5):.1f}, {1e6 * quantile(v, .9):.1f}, "
              f"{1e6 * quantile(v, .99):.1f}, {1e6 * quantile(v, .999):.1f}")
    total = sum(notice_cpu0.values())
    if total > 0:
        print("CPU 0 between a frame and the server's wake, %: " + ", ".join(
            f"{r} {100 * v / total:.1f}" for r, v in sorted(notice_cpu0.items(), key=lambda x: -x[1])))


if __name__ == '__main__':
    main()
