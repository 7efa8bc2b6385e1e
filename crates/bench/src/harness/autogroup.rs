//! The bench's scheduling weight against other sessions' programs.
//!
//! With `CONFIG_SCHED_AUTOGROUP` on (`/proc/sys/kernel/sched_autogroup_enabled`
//! = 1, Debian's default), Linux first shares a CPU between *sessions*
//! (autogroups), each weighted by its autogroup's nice, and only then between
//! the threads of one session by their own nice. A bench that renices its
//! threads to -10 is then ahead of nothing outside its session: another
//! session's compiler got as much of the server CPU as kv-server's kthread
//! (docs/results.md, "Session 20: memcached on the direct path"). So the
//! benches that mean to run ahead of whatever else the machine runs set
//! their autogroup's nice as well, and put the old value back when done,
//! also when SIGINT, SIGTERM or SIGHUP ends them (`ginza_sys::autogroup`;
//! before session 30 a bench ended so left its shell's session at -10).
//! SIGKILL still leaves it set until the session ends.
//! Both systems of a comparison run in the same session, so this favours
//! neither. A kernel built without autogroups shares CPUs by the threads'
//! own nice alone; there is nothing to set.

use std::process::{Child, Command};

use ginza_sys::autogroup::OnSignal;
use ginza_sys::sched_class::{autogroup_nice, set_autogroup_nice, set_autogroup_nice_of};
use ginza_sys::task_group::start_own_session;

/// The autogroup's nice, set for this guard's life.
pub(crate) struct AutogroupNice {
    before: i32,
    /// What was set, for the report.
    pub(crate) now: i32,
    /// Puts `before` back if a signal ends the process first.
    _on_signal: Option<OnSignal>,
}

impl AutogroupNice {
    /// Sets this session's autogroup nice to `nice`; `None` where the
    /// kernel has no autogroups, or (with a warning) where it may not be
    /// set (below 0 needs root).
    pub(crate) fn set(nice: i32) -> Option<AutogroupNice> {
        let before = autogroup_nice()?;
        let on_signal = OnSignal::install(before)
            .map_err(|e| {
                eprintln!(
                    "warning: a signal that ends the bench will leave the session's \
                     niceness at {nice}, not {before} ({e})"
                )
            })
            .ok();
        if let Err(e) = set_autogroup_nice(nice) {
            eprintln!("warning: cannot set the autogroup's niceness to {nice} ({e})");
            return None;
        }
        let now = autogroup_nice()?;
        (now == nice).then_some(AutogroupNice {
            before,
            now,
            _on_signal: on_signal,
        })
    }
}

impl Drop for AutogroupNice {
    fn drop(&mut self) {
        let _ = set_autogroup_nice(self.before);
    }
}

/// Spawns `cmd` in a session of its own whose autogroup gets this
/// session's niceness: a server out of the bench's task group, where
/// beside the busy generator or iokerneld it could starve the kernel's
/// threads on its CPU (docs/runtime.md, "Task groups"), and still as far
/// ahead of other sessions' programs as the bench.
pub(crate) fn spawn_in_own_session(cmd: &mut Command) -> std::io::Result<Child> {
    start_own_session(cmd);
    let child = cmd.spawn()?;
    if let Some(nice) = autogroup_nice() {
        if let Err(e) = set_autogroup_nice_of(child.id(), nice) {
            eprintln!("warning: the server's session stays at niceness 0, not {nice} ({e})");
        }
    }
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setting_it_takes_effect_and_is_undone() {
        let Some(before) = autogroup_nice() else {
            // A kernel without autogroups: there is nothing to set, and
            // the guard says so rather than pretending.
            assert!(AutogroupNice::set(-5).is_none());
            println!("no /proc/self/autogroup here: checked that the guard refuses");
            return;
        };
        let target = if before == -5 { -6 } else { -5 };
        let Some(guard) = AutogroupNice::set(target) else {
            ginza_iokernel::testing::skip("the autogroup's nice cannot be set (not root)");
            return;
        };
        assert_eq!(autogroup_nice(), Some(target));
        assert_eq!(guard.now, target);
        drop(guard);
        assert_eq!(autogroup_nice(), Some(before));
    }
}
