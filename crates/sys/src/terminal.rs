//! The size of the terminal a program writes to (`ginza top` fits its
//! table to it).

use std::os::fd::AsFd;

/// Rows and columns of the terminal behind `fd`; `None` when it is not a
/// terminal or reports no size.
pub fn size(fd: impl AsFd) -> Option<(usize, usize)> {
    let ws = rustix::termios::tcgetwinsize(fd).ok()?;
    (ws.ws_row > 0 && ws.ws_col > 0).then(|| (usize::from(ws.ws_row), usize::from(ws.ws_col)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_no_terminal() {
        let f = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(size(&f), None);
    }
}
