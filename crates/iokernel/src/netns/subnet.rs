//! The fixture's subnet, 10.77.N.0/24, reserved across processes.
//!
//! The namespace's own addresses live only inside it, but a Linux peer's
//! address ([`super::NetNs::add_host_address`]) goes on the veth's host end
//! in the root namespace, which every process shares. Two fixtures alive at
//! once on the same subnet (two test binaries, or a test beside a bench run
//! on the same machine) then give the root namespace two routes to it: its
//! answers leave by whichever veth the kernel picks, often the other
//! process's, and a client sees a refusal or nothing. So a subnet is held
//! by an exclusive `flock` on its own file for as long as the fixture
//! lives; the kernel lets go of it when the process dies, however it dies.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// Where the lock files live (beside `/run/netns`, root's like it).
pub(super) const DIR: &str = "/run/ginza-netns";

/// Subnets 10.77.0.0/24 to 10.77.249.0/24.
const SUBNETS: u32 = 250;

/// A subnet held until this is dropped.
#[derive(Debug)]
pub(super) struct Subnet {
    pub(super) octet: u8,
    /// Holds the `flock`; dropping it releases the subnet.
    _lock: File,
}

/// The first subnet from `start` on (wrapping) that no live fixture holds,
/// its lock file in `dir`.
pub(super) fn reserve(dir: &Path, start: u32) -> io::Result<Subnet> {
    std::fs::create_dir_all(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", dir.display())))?;
    for i in 0..SUBNETS {
        let octet = ((start.wrapping_add(i)) % SUBNETS) as u8;
        let path: PathBuf = dir.join(format!("subnet-{octet}"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("opening {}: {e}", path.display())))?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(Subnet { octet, _lock: file }),
            Err(rustix::io::Errno::WOULDBLOCK) => continue,
            Err(e) => {
                let e = io::Error::from(e);
                return Err(io::Error::new(
                    e.kind(),
                    format!("locking {}: {e}", path.display()),
                ));
            }
        }
    }
    Err(io::Error::other(format!(
        "all {SUBNETS} subnets 10.77.N.0/24 are held by live fixtures (lock files in {})",
        dir.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ginza-subnet-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn two_live_fixtures_never_share_a_subnet_and_a_dropped_one_frees_it() {
        let dir = scratch_dir("share");
        // Both start from the same candidate, as two processes whose
        // counters both begin at 0 did before subnets were reserved.
        let a = reserve(&dir, 0).unwrap();
        let b = reserve(&dir, 0).unwrap();
        assert_eq!(a.octet, 0);
        assert_eq!(b.octet, 1, "the held subnet 0 was handed out again");
        drop(a);
        let c = reserve(&dir, 0).unwrap();
        assert_eq!(c.octet, 0, "a dropped fixture's subnet stayed held");
        drop((b, c));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_search_wraps_past_the_last_subnet() {
        let dir = scratch_dir("wrap");
        let last = reserve(&dir, SUBNETS - 1).unwrap();
        assert_eq!(last.octet, 249);
        let next = reserve(&dir, SUBNETS - 1).unwrap();
        assert_eq!(next.octet, 0);
        drop((last, next));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
