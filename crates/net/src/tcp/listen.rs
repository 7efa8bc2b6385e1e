//! A listening port: SYNs become half-open connections, completed handshakes
//! wait in a bounded accept backlog (docs/design.md, "The runtime" →
//! Networking). Bounded so a SYN flood cannot grow memory without limit.
