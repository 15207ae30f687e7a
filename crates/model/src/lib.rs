//! Scratch.
