//! Ginza runtime (being written).
