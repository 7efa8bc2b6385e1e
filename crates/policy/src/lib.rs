//! Ginza policies: pure code, no I/O (see DESIGN.md, "The core allocator").
