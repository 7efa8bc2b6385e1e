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
//! their autogroup's nice as well, and put the old value back when done
//! (a bench killed by a signal leaves it set until its session ends).
//! Both systems of a comparison run in the same session, so this favours
//! neither.

use std::path::Path;

const AUTOGROUP: &str = "/proc/self/autogroup";

/// The autogroup's nice, set for this guard's life.
pub(crate) struct AutogroupNice {
    before: i32,
    /// What was set, for the report.
    pub(crate) now: i32,
}

impl AutogroupNice {
    /// Sets this session's autogroup nice to `nice`; `None` where there
    /// are no autogroups or it may not be set (not root).
    pub(crate) fn set(nice: i32) -> Option<AutogroupNice> {
        let before = read(Path::new(AUTOGROUP))?;
        std::fs::write(AUTOGROUP, nice.to_string()).ok()?;
        let now = read(Path::new(AUTOGROUP))?;
        (now == nice).then_some(AutogroupNice { before, now })
    }
}

impl Drop for AutogroupNice {
    fn drop(&mut self) {
        let _ = std::fs::write(AUTOGROUP, self.before.to_string());
    }
}

/// The nice of `/proc/self/autogroup`'s line (`/autogroup-N nice X`).
fn read(path: &Path) -> Option<i32> {
    parse(&std::fs::read_to_string(path).ok()?)
}

fn parse(line: &str) -> Option<i32> {
    line.split_whitespace()
        .skip_while(|w| *w != "nice")
        .nth(1)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nice_is_read_from_the_autogroup_line() {
        assert_eq!(parse("/autogroup-286 nice -10\n"), Some(-10));
        assert_eq!(parse("/autogroup-1 nice 0\n"), Some(0));
        assert_eq!(parse("/autogroup-1\n"), None);
        assert_eq!(parse("/autogroup-1 nice x\n"), None);
    }

    #[test]
    fn setting_it_takes_effect_and_is_undone() {
        // Only where there are autogroups and we may set them (root).
        let Some(before) = read(Path::new(AUTOGROUP)) else {
            ginza_iokernel::testing::skip("no /proc/self/autogroup (kernel without autogroups)");
            return;
        };
        let target = if before == -5 { -6 } else { -5 };
        let Some(guard) = AutogroupNice::set(target) else {
            ginza_iokernel::testing::skip("the autogroup's nice cannot be set (not root)");
            return;
        };
        assert_eq!(read(Path::new(AUTOGROUP)), Some(target));
        assert_eq!(guard.now, target);
        drop(guard);
        assert_eq!(read(Path::new(AUTOGROUP)), Some(before));
    }
}
