//! What the host hands a plugin: its config text, identity and services
//! (log sink and clock). Each cdylib has its own globals, so nothing here is
//! reached through a global: it all travels in [`HostContext`].

use abi_stable::{
    sabi_trait,
    std_types::{RBox, RStr, RString},
    StableAbi,
};

/// Severity of a forwarded log record.
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct LogLevel(pub u8);

impl LogLevel {
    /// Very verbose diagnostics.
    pub const TRACE: LogLevel = LogLevel(0);
    /// Decisions and details.
    pub const DEBUG: LogLevel = LogLevel(1);
    /// Lifecycle events.
    pub const INFO: LogLevel = LogLevel(2);
    /// Degraded but continuing.
    pub const WARN: LogLevel = LogLevel(3);
    /// Failures.
    pub const ERROR: LogLevel = LogLevel(4);
}

/// One log event emitted inside a plugin.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct LogRecord<'a> {
    /// Severity.
    pub level: LogLevel,
    /// The plugin-side `tracing` target (module path by default).
    pub target: RStr<'a>,
    /// The event's message.
    pub message: RStr<'a>,
    /// The other fields, rendered as `key=value` pairs separated by spaces.
    pub fields: RStr<'a>,
}

/// Services the host provides to every plugin instance.
#[sabi_trait]
pub trait HostServices: Send + Sync {
    /// Whether a record at `level` for `target` would be kept (cheap pre-check).
    fn log_enabled(&self, level: LogLevel, target: RStr<'_>) -> bool;

    /// Forwards one record to the host's subscriber.
    fn log(&self, record: LogRecord<'_>);

    /// Wall clock, nanoseconds since the Unix epoch. Injected so tests control time.
    fn now_unix_nanos(&self) -> u64;

    /// Monotonic clock in nanoseconds from an arbitrary origin.
    #[sabi(last_prefix_field)]
    fn monotonic_nanos(&self) -> u64;
}

/// Host services trait object.
pub type HostServicesBox = HostServices_TO<'static, RBox<()>>;

/// Everything a plugin constructor receives.
#[repr(C)]
#[derive(StableAbi)]
pub struct HostContext {
    /// The plugin's configured instance name (`[[plugin]] name`).
    pub instance: RString,
    /// The plugin's own config table, rendered as TOML text (empty when absent).
    pub config: RString,
    /// The host node's name, for logs.
    pub node_name: RString,
    /// A tag unique to this node instance (pid, start time and a random part),
    /// safe to embed in OS resource names such as shared-memory segments.
    pub node_tag: RString,
    /// Log sink and clock.
    pub services: HostServicesBox,
}

impl std::fmt::Debug for HostContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostContext")
            .field("instance", &self.instance)
            .field("node_name", &self.node_name)
            .field("node_tag", &self.node_tag)
            .finish_non_exhaustive()
    }
}
