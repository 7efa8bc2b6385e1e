//! The `bpf(2)` commands iokerneld uses, each with the `#[repr(C)]` prefix
//! of `union bpf_attr` it needs (the kernel reads bytes past the size
//! passed as zero): maps and their elements, loading a program, the XDP
//! link, and a test run of a program on one frame.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::asm::Insn;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_LINK_CREATE: libc::c_long = 28;

pub const BPF_MAP_TYPE_HASH: u32 = 1;
pub const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
pub const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

/// Bytes of verifier log kept for an error.
const LOG_SIZE: usize = 64 * 1024;

#[repr(C)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

#[repr(C)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
struct TestRun {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
}

#[repr(C)]
struct LinkCreate {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// bpf(cmd, attr, sizeof attr).
fn bpf<T>(command: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live `#[repr(C)]` prefix of `union bpf_attr` for
    // `command`, of the size passed; pointers inside it point to memory
    // that outlives the call and is as large as the sizes beside them say.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attr as *mut T,
            size_of::<T>() as libc::c_uint,
        )
    };
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

fn new_fd(command: libc::c_long, attr: &mut impl Sized) -> io::Result<OwnedFd> {
    let fd = bpf(command, attr)?;
    // SAFETY: these commands return a new descriptor nothing else owns (the
    // kernel sets close-on-exec on bpf descriptors).
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// A name as the kernel keeps it (15 bytes and a NUL at most).
fn object_name(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (d, s) in out[..15].iter_mut().zip(name.bytes()) {
        *d = s;
    }
    out
}

/// A map of `max_entries` entries with 4-byte keys and values.
pub fn map_create(map_type: u32, max_entries: u32, name: &str) -> io::Result<OwnedFd> {
    new_fd(
        BPF_MAP_CREATE,
        &mut MapCreate {
            map_type,
            key_size: 4,
            value_size: 4,
            max_entries,
            map_flags: 0,
            inner_map_fd: 0,
            numa_node: 0,
            map_name: object_name(name),
        },
    )
}

fn elem(map: &OwnedFd, key: &[u8; 4], value: Option<&mut [u8; 4]>) -> MapElem {
    MapElem {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: key.as_ptr() as u64,
        value: value.map_or(0, |v| v.as_mut_ptr() as u64),
        flags: 0,
    }
}

/// Sets `key` to `value` (`BPF_ANY`: creates or replaces).
pub fn map_update(map: &OwnedFd, key: [u8; 4], mut value: [u8; 4]) -> io::Result<()> {
    bpf(BPF_MAP_UPDATE_ELEM, &mut elem(map, &key, Some(&mut value))).map(drop)
}

/// Removes `key` (`ENOENT` if it is not there).
pub fn map_delete(map: &OwnedFd, key: [u8; 4]) -> io::Result<()> {
    bpf(BPF_MAP_DELETE_ELEM, &mut elem(map, &key, None)).map(drop)
}

/// The value of `key`, `None` if it is not there.
pub fn map_lookup(map: &OwnedFd, key: [u8; 4]) -> io::Result<Option<[u8; 4]>> {
    let mut value = [0u8; 4];
    match bpf(BPF_MAP_LOOKUP_ELEM, &mut elem(map, &key, Some(&mut value))) {
        Ok(_) => Ok(Some(value)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Loads an XDP program; a refusal carries the verifier's log.
pub fn load_xdp_program(insns: &[Insn], name: &str) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let mut log = vec![0u8; LOG_SIZE];
    let mut attr = ProgLoad {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        kern_version: 0,
        prog_flags: 0,
        prog_name: object_name(name),
        prog_ifindex: 0,
        expected_attach_type: BPF_XDP,
    };
    new_fd(BPF_PROG_LOAD, &mut attr).map_err(|error| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let log = String::from_utf8_lossy(&log[..end]);
        io::Error::new(error.kind(), format!("{error}; verifier: {}", log.trim()))
    })
}

/// Attaches an XDP program to an interface with `flags` (the mode); the
/// program stays attached while the link's descriptor is open.
pub fn link_xdp(program: &OwnedFd, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
    new_fd(
        BPF_LINK_CREATE,
        &mut LinkCreate {
            prog_fd: program.as_raw_fd() as u32,
            target_ifindex: ifindex,
            attach_type: BPF_XDP,
            flags,
        },
    )
}

/// Runs `program` once on a copy of `frame` (`BPF_PROG_TEST_RUN`) and
/// returns its verdict. The kernel refuses frames shorter than an Ethernet
/// header (`EINVAL`).
pub fn test_run(program: &OwnedFd, frame: &[u8]) -> io::Result<u32> {
    let mut attr = TestRun {
        prog_fd: program.as_raw_fd() as u32,
        retval: 0,
        data_size_in: frame.len() as u32,
        data_size_out: 0,
        data_in: frame.as_ptr() as u64,
        data_out: 0,
        repeat: 1,
        duration: 0,
    };
    bpf(BPF_PROG_TEST_RUN, &mut attr)?;
    Ok(attr.retval)
}
