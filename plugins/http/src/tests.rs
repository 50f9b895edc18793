//! Whole-instance tests (filled in below).
