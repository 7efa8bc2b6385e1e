//! Which of Linux's task groups a process's threads are scheduled in, and
//! starting a child in a group of its own.
//!
//! Linux shares a CPU between task groups first and between the threads
//! of one group after. A process's group is its `cpu` cgroup, or, in the
//! root cgroup with `kernel.sched_autogroup_enabled`, its session's
//! autogroup: everything started from one shell shares one.
//!
//! Measured on this project's kernel (6.18, docs/soak.md "Findings",
//! session 37): when one group has a thread busy on one CPU and, on a
//! second CPU, a thread that stays runnable beside another that sleeps
//! and wakes every few tens of microseconds, every other group's thread
//! on the second CPU — kernel threads included — can wait for seconds
//! with no end in sight. iokerneld busy-polling on its core, a batch
//! kthread and a parking latency-critical kthread on a managed core is
//! that pattern exactly, if all three share a session. So the soak starts
//! its processes in sessions of their own ([`start_own_session`]), batch
//! goes into an idle cgroup where it can ([`IdleGroup`]), and iokerneld
//! warns about an application that shares its group ([`task_group_of`]).

use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

/// A process's task group for the fair scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskGroup {
    /// The root group, where the kernel's own threads are.
    Root,
    /// A `cpu` cgroup, by its path.
    Cgroup(String),
    /// A session's autogroup, by its number.
    Autogroup(u64),
}

impl std::fmt::Display for TaskGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TaskGroup::Root => write!(f, "the root task group"),
            TaskGroup::Cgroup(path) => write!(f, "cgroup {path}"),
            TaskGroup::Autogroup(n) => write!(f, "autogroup-{n}"),
        }
    }
}

/// The task group of process `pid`, from `/proc/PID/cgroup` and
/// `/proc/PID/autogroup`.
pub fn task_group_of(pid: u32) -> io::Result<TaskGroup> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let autogroup = std::fs::read_to_string(format!("/proc/{pid}/autogroup")).ok();
    let enabled = crate::sched_class::autogroups_enabled();
    Ok(task_group_from(
        &cgroups,
        autogroup.as_deref().filter(|_| enabled),
    ))
}

/// The group named by a `/proc/PID/cgroup` text and, where autogroups are
/// on, a `/proc/PID/autogroup` line ("/autogroup-N nice K").
fn task_group_from(cgroups: &str, autogroup: Option<&str>) -> TaskGroup {
    let cpu_cgroup = cgroups
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let is_cpu = controllers.split(',').any(|c| c == "cpu");
            // v1 names the `cpu` controller; v2's one line names none.
            (is_cpu || controllers.is_empty()).then_some((is_cpu, path))
        })
        .max_by_key(|(is_cpu, _)| *is_cpu)
        .map(|(_, path)| path.trim());
    match cpu_cgroup {
        Some(path) if path != "/" => TaskGroup::Cgroup(path.to_string()),
        _ => autogroup
            .and_then(|line| {
                line.trim()
                    .strip_prefix("/autogroup-")?
                    .split(' ')
                    .next()?
                    .parse()
                    .ok()
            })
            .map_or(TaskGroup::Root, TaskGroup::Autogroup),
    }
}

/// Makes the child begin a session of its own (`setsid` between fork and
/// exec), hence an autogroup of its own. It then has no controlling
/// terminal: a Ctrl-C there no longer reaches it, so its parent must end
/// it.
pub fn start_own_session(cmd: &mut Command) -> &mut Command {
    // SAFETY: the hook runs in the child between fork and exec and only
    // calls setsid(2), which is async-signal-safe and touches no memory of
    // the parent's.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::setsid()?;
            Ok(())
        })
    }
}

/// A `cpu` cgroup marked idle (`cpu.idle` = 1): its threads run on a CPU
/// only when no other group's want it, as `SCHED_IDLE` threads do within
/// one group. Across task groups a thread's own `SCHED_IDLE` does not put
/// it behind another group's threads, and an always-runnable batch thread
/// in the group of a busy server is the starving pattern above; a group
/// of its own that is idle is where batch belongs (systemd's
/// `CPUWeight=idle` makes the same).
#[derive(Debug)]
pub struct IdleGroup {
    dir: PathBuf,
    /// cgroup v1, where single threads may be moved.
    per_thread: bool,
}

impl IdleGroup {
    /// Makes (or reuses) cgroup `name` under the `cpu` controller's root
    /// and marks it idle. Needs root, and a kernel with `cpu.idle` (5.15).
    pub fn open(name: &str) -> io::Result<IdleGroup> {
        let mounts = std::fs::read_to_string("/proc/self/mounts")?;
        let (root, per_thread) = cpu_controller_root(&mounts).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "no cgroup with the cpu controller is mounted",
            )
        })?;
        let dir = root.join(name);
        match std::fs::create_dir(&dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("making {}: {e}", dir.display()),
                ))
            }
            _ => {}
        }
        let group = IdleGroup { dir, per_thread };
        group.write("cpu.idle", "1")?;
        Ok(group)
    }

    /// Moves thread `tid` into the group; cgroup v2 moves only whole
    /// processes (outside threaded subtrees) and refuses.
    pub fn add_thread(&self, tid: i32) -> io::Result<()> {
        if !self.per_thread {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "cgroup v2 moves whole processes only",
            ));
        }
        self.write("tasks", &tid.to_string())
    }

    /// Moves every thread of process `pid` into the group.
    pub fn add_process(&self, pid: u32) -> io::Result<()> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// Makes the child of `cmd` join the group between fork and exec, so
    /// that none of its own code runs outside it.
    pub fn start_child_in(&self, cmd: &mut Command) -> io::Result<()> {
        let path = self.dir.join("cgroup.procs");
        let procs: std::os::fd::OwnedFd = std::fs::File::options()
            .write(true)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("opening {}: {e}", path.display())))?
            .into();
        // SAFETY: the hook runs in the child between fork and exec and
        // only calls write(2), async-signal-safe, on a descriptor opened
        // before the fork ("0": the writing process itself).
        unsafe {
            cmd.pre_exec(move || {
                rustix::io::write(&procs, b"0")?;
                Ok(())
            });
        }
        Ok(())
    }

    /// Writes `text` to the group's file `name`; an error names the file.
    fn write(&self, name: &str, text: &str) -> io::Result<()> {
        let path = self.dir.join(name);
        std::fs::write(&path, text).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("writing {text} to {}: {e}", path.display()),
            )
        })
    }
}

/// Where the `cpu` controller's hierarchy is mounted, from
/// `/proc/self/mounts`, and whether it is cgroup v1 (per-thread moves).
fn cpu_controller_root(mounts: &str) -> Option<(PathBuf, bool)> {
    let mut v2 = None;
    for line in mounts.lines() {
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        let [_, path, kind, options, ..] = fields[..] else {
            continue;
        };
        match kind {
            "cgroup" if options.split(',').any(|o| o == "cpu") => {
                return Some((PathBuf::from(path), true))
            }
            "cgroup2" => v2 = Some((PathBuf::from(path), false)),
            _ => {}
        }
    }
    v2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_group_is_the_cpu_cgroup_else_the_autogroup() {
        let v1_root = "9:name=systemd:/\n4:memory:/x/y\n1:cpu:/\n0::/\n";
        assert_eq!(
            task_group_from(v1_root, Some("/autogroup-119 nice 0\n")),
            TaskGroup::Autogroup(119)
        );
        assert_eq!(task_group_from(v1_root, None), TaskGroup::Root);
        let v1_cgroup = "2:cpu,cpuacct:/batch\n0::/\n";
        assert_eq!(
            task_group_from(v1_cgroup, Some("/autogroup-7 nice 0\n")),
            TaskGroup::Cgroup("/batch".into())
        );
        let v2 = "0::/system.slice/ginza.service\n";
        assert_eq!(
            task_group_from(v2, Some("/autogroup-7 nice 0\n")),
            TaskGroup::Cgroup("/system.slice/ginza.service".into())
        );
        assert_eq!(
            task_group_from("0::/\n", Some("/autogroup-7 nice -10\n")),
            TaskGroup::Autogroup(7)
        );
        assert_eq!(task_group_from("0::/\n", Some("garbage")), TaskGroup::Root);
    }

    #[test]
    fn the_cpu_controller_is_found_in_v1_or_v2_mounts() {
        let v1 = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/cpuacct cgroup rw,cpuacct 0 0\ncgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n";
        assert_eq!(
            cpu_controller_root(v1),
            Some((PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"), true))
        );
        let v2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n";
        assert_eq!(
            cpu_controller_root(v2),
            Some((PathBuf::from("/sys/fs/cgroup"), false))
        );
        assert_eq!(cpu_controller_root("proc /proc proc rw 0 0\n"), None);
    }

    #[test]
    fn a_thread_or_a_child_moved_into_an_idle_group_is_in_it() {
        let group = match IdleGroup::open("ginza-test-idle") {
            Ok(group) => group,
            Err(e) => return crate::testing::skip(format!("no idle cgroup here ({e})")),
        };
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            tid_tx.send(crate::process::gettid()).unwrap();
            let _ = done_rx.recv();
        });
        let tid = tid_rx.recv().unwrap();
        let moved = group.per_thread.then(|| {
            group.add_thread(tid).expect("moving the thread");
            std::fs::read_to_string(format!("/proc/self/task/{tid}/cgroup")).unwrap()
        });
        done_tx.send(()).unwrap();
        thread.join().unwrap();
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        group
            .start_child_in(&mut cmd)
            .expect("opening cgroup.procs");
        let mut child = cmd.spawn().expect("starting sleep");
        let child_group = task_group_of(child.id());
        child.kill().ok();
        child.wait().ok();
        let idle = std::fs::read_to_string(group.dir.join("cpu.idle")).unwrap();
        let _ = std::fs::remove_dir(&group.dir);
        assert_eq!(idle.trim(), "1");
        assert_eq!(
            child_group.expect("the child's group"),
            TaskGroup::Cgroup("/ginza-test-idle".into()),
            "the child started in the group"
        );
        if let Some(cgroups) = moved {
            assert!(
                cgroups.contains(":/ginza-test-idle"),
                "the thread's groups: {cgroups}"
            );
        }
    }

    /// The session of process `pid`, from `/proc/PID/stat` (the fourth
    /// field after the command's closing parenthesis). It may be 0: a
    /// process whose ancestors never began a session (as under a CI
    /// runner that is pid 1) is in none, and `getsid` says 0.
    fn session_of(pid: u32) -> i32 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after_command = &stat[stat.rfind(')').unwrap() + 1..];
        after_command
            .split_ascii_whitespace()
            .nth(3)
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn a_child_in_its_own_session_is_in_a_group_of_its_own() {
        let me = task_group_of(std::process::id()).expect("our task group");
        let spawn = |own: bool| {
            let mut cmd = Command::new("sleep");
            cmd.arg("30");
            if own {
                start_own_session(&mut cmd);
            }
            cmd.spawn().expect("starting sleep")
        };
        let (mut plain, mut own) = (spawn(false), spawn(true));
        let groups = (task_group_of(plain.id()), task_group_of(own.id()));
        let sessions = (session_of(std::process::id()), session_of(own.id()));
        for child in [&mut plain, &mut own] {
            child.kill().ok();
            child.wait().ok();
        }
        assert_ne!(sessions.0, sessions.1, "the child began a session");
        assert_eq!(groups.0.expect("the plain child's group"), me);
        let own_group = groups.1.expect("the own-session child's group");
        if matches!(me, TaskGroup::Autogroup(_) | TaskGroup::Root)
            && crate::sched_class::autogroups_enabled()
        {
            assert_ne!(own_group, me, "a new session is a new autogroup");
        }
    }
}
