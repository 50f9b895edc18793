//! The stable error every plugin call returns on failure.

use std::fmt;

use abi_stable::{std_types::RString, StableAbi};

/// Machine-readable class of an [`AbiError`]. Carried as a code so a newer
/// plugin's new kinds stay representable in an older host.
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorKind(pub u16);

macro_rules! error_kinds {
    ($( $(#[$doc:meta])* $konst:ident = $code:literal, $name:literal; )*) => {
        impl ErrorKind {
            $( $(#[$doc])* pub const $konst: ErrorKind = ErrorKind($code); )*

            /// Lowercase snake-case name, `None` for a code this version does not know.
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $( $code => Some($name), )*
                    _ => None,
                }
            }
        }
    };
}

error_kinds! {
    /// The plugin's configuration table is invalid (the message names the key).
    CONFIG = 1, "config";
    /// A descriptor from another process is malformed or points outside what it may.
    INVALID_DESCRIPTOR = 2, "invalid_descriptor";
    /// An argument from the host is invalid (length mismatch, unknown token).
    INVALID_ARGUMENT = 3, "invalid_argument";
    /// The shard is not (or no longer) exported by its owner.
    NOT_FOUND = 4, "not_found";
    /// The transport cannot reach the shard from here (other node, missing segment).
    UNAVAILABLE = 5, "unavailable";
    /// A bounded resource ran out: pool space, lease slots, descriptors.
    RESOURCE_EXHAUSTED = 6, "resource_exhausted";
    /// The operating system refused access.
    PERMISSION_DENIED = 7, "permission_denied";
    /// The transport does not implement this operation.
    UNSUPPORTED = 8, "unsupported";
    /// An I/O or system call failed.
    IO = 9, "io";
    /// An operation did not finish within its deadline.
    TIMEOUT = 10, "timeout";
    /// The plugin panicked; the call was abandoned and the host kept running.
    PANIC = 11, "panic";
    /// A bug or broken invariant inside the plugin.
    INTERNAL = 12, "internal";
}

impl fmt::Debug for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "unknown({})", self.0),
        }
    }
}

/// A failure reported by a plugin: a kind, a one-line message (lowercase, no
/// trailing period, naming what was wrong and where) and optional detail.
#[repr(C)]
#[derive(StableAbi, Clone, PartialEq, Eq)]
pub struct AbiError {
    /// Class of the failure.
    pub kind: ErrorKind,
    /// One-line message.
    pub message: RString,
    /// Longer context (an OS error, a backtrace); may be empty.
    pub detail: RString,
}

impl AbiError {
    /// A new error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        AbiError {
            kind,
            message: RString::from(message.into()),
            detail: RString::new(),
        }
    }

    /// Attaches detail text.
    #[must_use]
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = RString::from(detail.into());
        self
    }

    /// `ErrorKind::CONFIG` shorthand.
    pub fn config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::CONFIG, message)
    }

    /// `ErrorKind::INVALID_DESCRIPTOR` shorthand.
    pub fn invalid_descriptor(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::INVALID_DESCRIPTOR, message)
    }

    /// `ErrorKind::INVALID_ARGUMENT` shorthand.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::INVALID_ARGUMENT, message)
    }

    /// `ErrorKind::NOT_FOUND` shorthand.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NOT_FOUND, message)
    }

    /// `ErrorKind::UNAVAILABLE` shorthand.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::UNAVAILABLE, message)
    }

    /// `ErrorKind::UNSUPPORTED` shorthand.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::UNSUPPORTED, message)
    }

    /// `ErrorKind::INTERNAL` shorthand.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::INTERNAL, message)
    }

    /// An `ErrorKind::IO` error whose message names the operation and what it
    /// acted on, with the OS error appended.
    pub fn io(what: impl fmt::Display, err: &std::io::Error) -> Self {
        let kind = match err.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NOT_FOUND,
            std::io::ErrorKind::PermissionDenied => ErrorKind::PERMISSION_DENIED,
            _ => ErrorKind::IO,
        };
        Self::new(kind, format!("{what}: {err}"))
    }
}

impl fmt::Debug for AbiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AbiError")
            .field("kind", &self.kind)
            .field("message", &self.message.as_str())
            .field("detail", &self.detail.as_str())
            .finish()
    }
}

impl fmt::Display for AbiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.kind)
    }
}

impl std::error::Error for AbiError {}

/// Result type of plugin-side code before it crosses the boundary.
pub type PluginResult<T> = Result<T, AbiError>;
