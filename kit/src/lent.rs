//! Reading lent bytes without `unsafe`: [`Lent`].
//!
//! [`SharedBytes`](shardport_abi::SharedBytes) is a raw pointer and a length: its
//! validity ("until `unexport` returns") is a contract, not a Rust lifetime,
//! so [`SharedBytes::as_slice`](shardport_abi::SharedBytes::as_slice) is `unsafe`.
//! Where the validity can be established when the value is made (a borrow,
//! a [`ReadOnlyMap`](crate::ReadOnlyMap)), make a [`Lent`] instead: it
//! carries the lifetime and reads safely. A plugin's `export` turns its
//! request into one with the single `unsafe` call [`Lent::from_export`],
//! in its `sys` module.

pub use super::sys::Lent;
