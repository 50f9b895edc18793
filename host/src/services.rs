//! The host side of [`HostServices`]: plugin log records land in the host's
//! `tracing` subscriber (target `plugin`, with the plugin name and its own
//! target as fields); clocks come from an injectable [`Clock`].

use std::{
    sync::Arc,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use shardport_abi::{HostServices, LogLevel, LogRecord, RStr};
use tracing::Level;

/// Time source, injected so cleanup decisions are testable without sleeping.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Nanoseconds since the Unix epoch.
    fn now_unix_nanos(&self) -> u64;
    /// Monotonic nanoseconds from an arbitrary origin.
    fn monotonic_nanos(&self) -> u64;
}

/// The operating system's clocks.
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn now_unix_nanos(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }

    fn monotonic_nanos(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }
}

/// Services handed to one plugin instance.
#[derive(Debug)]
pub struct PluginServices {
    /// Plugin (transport) name, attached to every forwarded record.
    pub plugin: String,
    /// Node name, attached to every forwarded record.
    pub node: String,
    /// Clock.
    pub clock: Arc<dyn Clock>,
}

fn level(l: LogLevel) -> Level {
    match l {
        LogLevel::TRACE => Level::TRACE,
        LogLevel::DEBUG => Level::DEBUG,
        LogLevel::INFO => Level::INFO,
        LogLevel::WARN => Level::WARN,
        _ => Level::ERROR,
    }
}

impl HostServices for PluginServices {
    fn log_enabled(&self, l: LogLevel, _target: RStr<'_>) -> bool {
        match level(l) {
            Level::TRACE => tracing::enabled!(target: "plugin", Level::TRACE),
            Level::DEBUG => tracing::enabled!(target: "plugin", Level::DEBUG),
            Level::INFO => tracing::enabled!(target: "plugin", Level::INFO),
            Level::WARN => tracing::enabled!(target: "plugin", Level::WARN),
            _ => tracing::enabled!(target: "plugin", Level::ERROR),
        }
    }

    fn log(&self, r: LogRecord<'_>) {
        let (plugin, node, target, msg, fields) = (
            self.plugin.as_str(),
            self.node.as_str(),
            r.target.as_str(),
            r.message.as_str(),
            r.fields.as_str(),
        );
        macro_rules! emit {
            ($lvl:expr) => {
                tracing::event!(target: "plugin", $lvl, plugin, node, source = target, fields, "{msg}")
            };
        }
        match level(r.level) {
            Level::TRACE => emit!(Level::TRACE),
            Level::DEBUG => emit!(Level::DEBUG),
            Level::INFO => emit!(Level::INFO),
            Level::WARN => emit!(Level::WARN),
            _ => emit!(Level::ERROR),
        }
    }

    fn now_unix_nanos(&self) -> u64 {
        self.clock.now_unix_nanos()
    }

    fn monotonic_nanos(&self) -> u64 {
        self.clock.monotonic_nanos()
    }
}
