//! Turning failures into [`AbiError`]s people can act on.
//!
//! Every file and socket call gets context naming the file or address
//! ([`IoContext::context`]); the `io::ErrorKind` picks the [`ErrorKind`]
//! (a full disk is `RESOURCE_EXHAUSTED`, a port in use `UNAVAILABLE`...).
//! [`unsupported`] has the stock errors of a transport without views or an
//! allocator, so every transport words them the same way.

use std::{fmt::Display, io};

use shardport_abi::error::{AbiError, ErrorKind, PluginResult};

/// The [`ErrorKind`] for an I/O error.
pub fn io_kind(e: &io::Error) -> ErrorKind {
    use io::ErrorKind as K;
    match e.kind() {
        K::NotFound => ErrorKind::NOT_FOUND,
        K::PermissionDenied => ErrorKind::PERMISSION_DENIED,
        K::StorageFull | K::OutOfMemory => ErrorKind::RESOURCE_EXHAUSTED,
        K::TimedOut | K::WouldBlock => ErrorKind::TIMEOUT,
        K::AddrInUse
        | K::AddrNotAvailable
        | K::ConnectionRefused
        | K::ConnectionReset
        | K::ConnectionAborted
        | K::NotConnected
        | K::BrokenPipe
        | K::HostUnreachable
        | K::NetworkUnreachable
        | K::NetworkDown => ErrorKind::UNAVAILABLE,
        K::InvalidInput => ErrorKind::INVALID_ARGUMENT,
        K::Unsupported => ErrorKind::UNSUPPORTED,
        _ => ErrorKind::IO,
    }
}

/// `"{what}: {e}"` with the kind [`io_kind`] picks; `what` names the
/// operation and what it acted on (`cannot open `/var/spool/x.shard``).
pub fn io_error(what: impl Display, e: &io::Error) -> AbiError {
    AbiError::new(io_kind(e), format!("{what}: {e}"))
}

/// Adds context to fallible calls.
pub trait IoContext<T> {
    /// Maps the error to an [`AbiError`] whose message starts with `what`
    /// (see [`io_error`]).
    fn context(self, what: impl Display) -> PluginResult<T>;

    /// Like [`context`](Self::context), building `what` only on failure.
    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> PluginResult<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn context(self, what: impl Display) -> PluginResult<T> {
        self.map_err(|e| io_error(what, &e))
    }

    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> PluginResult<T> {
        self.map_err(|e| io_error(what(), &e))
    }
}

impl<T> IoContext<T> for PluginResult<T> {
    /// Prefixes the message (`"{what}: {message}"`), keeping the kind.
    fn context(self, what: impl Display) -> PluginResult<T> {
        self.map_err(|e| prefix(e, what))
    }

    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> PluginResult<T> {
        self.map_err(|e| prefix(e, what()))
    }
}

fn prefix(mut e: AbiError, what: impl Display) -> AbiError {
    e.message = format!("{what}: {}", e.message).into();
    e
}

/// Any error type with a `Display` (a plugin's own `thiserror` enum) as an
/// [`AbiError`] of `kind`, with `what` as context.
pub fn other(kind: ErrorKind, what: impl Display, e: &dyn std::error::Error) -> AbiError {
    let mut msg = format!("{what}: {e}");
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    AbiError::new(kind, msg)
}

/// The stock `UNSUPPORTED` errors of a transport that lacks a capability.
/// `transport` is its name (`"http"`).
pub mod unsupported {
    use shardport_abi::{error::AbiError, meta::ShardId};

    /// `import_view` of a transport without `ZERO_COPY`.
    pub fn no_views(transport: &str) -> AbiError {
        AbiError::unsupported(format!(
            "the {transport} transport copies (import_into); it has no zero-copy views"
        ))
    }

    /// `release` of a transport without `ZERO_COPY`.
    pub fn no_leases(transport: &str, token: u64) -> AbiError {
        AbiError::unsupported(format!(
            "release of token {token}: the {transport} transport hands out no views"
        ))
    }

    /// `allocate` of a transport without `ALLOCATOR`.
    pub fn no_allocator(transport: &str, id: ShardId) -> AbiError {
        AbiError::unsupported(format!(
            "allocate for shard {id}: the {transport} transport has no allocator \
             (use storage policy `heap`)"
        ))
    }

    /// `free_allocation` of a transport without `ALLOCATOR`.
    pub fn no_allocations(transport: &str, token: u64) -> AbiError {
        AbiError::unsupported(format!(
            "free_allocation of token {token}: the {transport} transport has no allocator"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_get_context_and_kind() {
        let r: io::Result<()> = Err(io::Error::from(io::ErrorKind::StorageFull));
        let e = r.context("cannot write `/x`").unwrap_err();
        assert_eq!(e.kind, ErrorKind::RESOURCE_EXHAUSTED);
        assert!(e.message.starts_with("cannot write `/x`: "), "{e}");
        let r: io::Result<()> = Err(io::Error::from(io::ErrorKind::NotFound));
        assert_eq!(
            r.with_context(|| "cannot open `/y`").unwrap_err().kind,
            ErrorKind::NOT_FOUND
        );
        for (k, want) in [
            (
                io::ErrorKind::PermissionDenied,
                ErrorKind::PERMISSION_DENIED,
            ),
            (io::ErrorKind::AddrInUse, ErrorKind::UNAVAILABLE),
            (io::ErrorKind::TimedOut, ErrorKind::TIMEOUT),
            (io::ErrorKind::Other, ErrorKind::IO),
        ] {
            assert_eq!(io_kind(&io::Error::from(k)), want, "{k:?}");
        }
        let r: PluginResult<()> = Err(AbiError::not_found("shard 1"));
        let e = r.context("fetch from 10.0.0.1:7071").unwrap_err();
        assert_eq!(e.kind, ErrorKind::NOT_FOUND);
        assert_eq!(e.message.as_str(), "fetch from 10.0.0.1:7071: shard 1");
    }

    #[test]
    fn other_errors_keep_their_chain() {
        #[derive(Debug)]
        struct Inner;
        impl std::fmt::Display for Inner {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("inner cause")
            }
        }
        impl std::error::Error for Inner {}
        #[derive(Debug)]
        struct Outer(Inner);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("outer")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = other(ErrorKind::INTERNAL, "driver call", &Outer(Inner));
        assert_eq!(e.message.as_str(), "driver call: outer: inner cause");
    }

    #[test]
    fn unsupported_errors() {
        use shardport_abi::meta::ShardId;
        for e in [
            unsupported::no_views("x"),
            unsupported::no_leases("x", 3),
            unsupported::no_allocator("x", ShardId::from_u128(1)),
            unsupported::no_allocations("x", 4),
        ] {
            assert_eq!(e.kind, ErrorKind::UNSUPPORTED);
            assert!(e.message.contains("the x transport"), "{e}");
        }
    }
}
