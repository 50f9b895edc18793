//! Test support: a host context for running a transport in-process, without
//! the shardport host (used by the conformance suite and plugin unit tests).

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use abi_stable::{
    sabi_trait::TD_Opaque,
    std_types::{RStr, RString},
};

use shardport_abi::host::{HostContext, HostServices, HostServicesBox, LogLevel, LogRecord};

/// Host services for tests: logs go to stderr at `WARN` and above (or every
/// level when `SHARDPORT_TEST_LOG` is set); clocks are the system's.
#[derive(Debug)]
pub struct TestServices {
    origin: Instant,
    verbose: bool,
}

impl Default for TestServices {
    fn default() -> Self {
        TestServices {
            origin: Instant::now(),
            verbose: std::env::var_os("SHARDPORT_TEST_LOG").is_some(),
        }
    }
}

impl HostServices for TestServices {
    fn log_enabled(&self, level: LogLevel, _target: RStr<'_>) -> bool {
        self.verbose || level >= LogLevel::WARN
    }

    fn log(&self, r: LogRecord<'_>) {
        eprintln!(
            "[plugin {:?} {}] {} {}",
            r.level, r.target, r.message, r.fields
        );
    }

    fn now_unix_nanos(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }

    fn monotonic_nanos(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }
}

/// One record [`CaptureServices`] kept: level, target, message, fields.
pub type CapturedRecord = (LogLevel, String, String, String);

/// Host services that keep every log record, at every level (to show a
/// plugin's events reach its host); both clocks read 0. Clones share the
/// records.
#[derive(Debug, Clone, Default)]
pub struct CaptureServices(Arc<Mutex<Vec<CapturedRecord>>>);

impl CaptureServices {
    /// Every record so far, oldest first.
    pub fn records(&self) -> Vec<CapturedRecord> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The messages of every record so far, oldest first.
    pub fn messages(&self) -> Vec<String> {
        self.records().into_iter().map(|(_, _, m, _)| m).collect()
    }
}

impl HostServices for CaptureServices {
    fn log_enabled(&self, _level: LogLevel, _target: RStr<'_>) -> bool {
        true
    }

    fn log(&self, r: LogRecord<'_>) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push((
            r.level,
            r.target.to_string(),
            r.message.to_string(),
            r.fields.to_string(),
        ));
    }

    fn now_unix_nanos(&self) -> u64 {
        0
    }

    fn monotonic_nanos(&self) -> u64 {
        0
    }
}

/// A node tag unique within this process and across processes
/// (`t<pid>-<counter>-<nanos>`), in the charset hosts guarantee (`[a-z0-9-]`).
pub fn unique_node_tag() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("t{}-{n}-{nanos:x}", std::process::id())
}

/// A context for instance `instance` with config text `config` and a fresh node tag.
pub fn context(instance: &str, config: &str) -> HostContext {
    context_with(instance, config, TestServices::default())
}

/// [`context`] with host services of the test's own (e.g. a
/// [`CaptureServices`] to see what the plugin logs).
pub fn context_with(
    instance: &str,
    config: &str,
    services: impl HostServices + 'static,
) -> HostContext {
    HostContext {
        instance: RString::from(instance),
        config: RString::from(config),
        node_name: RString::from("test"),
        node_tag: RString::from(unique_node_tag()),
        services: HostServicesBox::from_value(services, TD_Opaque),
    }
}

/// `PluginContext` (in `shardport-abi`) with this crate's capturing host:
/// log forwarding per instance and thread, panics turned into errors.
#[cfg(test)]
mod plugin_context_tests {
    use super::{context_with, CaptureServices as Sink};
    use abi_stable::std_types::RResult;
    use shardport_abi::{AbiError, ErrorKind, PluginContext};

    fn context(instance: &str, sink: &Sink) -> PluginContext {
        PluginContext::new(context_with(instance, "", sink.clone()))
    }

    #[test]
    fn each_instance_receives_its_own_events_on_every_thread() {
        let (sa, sb) = (Sink::default(), Sink::default());
        let (a, b) = (context("a", &sa), context("b", &sb));
        let log = |ctx: &PluginContext, msg: &'static str| {
            let r: RResult<(), AbiError> = ctx.guard("op", || {
                tracing::warn!("{msg}");
                Ok(())
            });
            assert!(r.is_ok());
        };
        // Alternating instances on one thread: each switch installs the
        // other's dispatcher; repeated calls keep it.
        log(&a, "a1");
        log(&b, "b1");
        log(&b, "b2");
        log(&a, "a2");
        // A clone shares its instance's dispatcher.
        log(&a.clone(), "a3");
        std::thread::scope(|s| {
            s.spawn(|| {
                log(&b, "b3");
                log(&a, "a4");
            });
        });
        log(&b, "b4");
        assert_eq!(sa.messages(), ["a1", "a2", "a3", "a4"]);
        assert_eq!(sb.messages(), ["b1", "b2", "b3", "b4"]);
    }

    #[test]
    fn a_panic_is_reported_to_its_instance_and_returned_as_an_error() {
        let sink = Sink::default();
        let ctx = context("p", &sink);
        let r: RResult<(), AbiError> = ctx.guard("export", || panic!("boom"));
        let e = r.into_result().unwrap_err();
        assert_eq!(e.kind, ErrorKind::PANIC);
        assert!(
            e.message.contains("plugin `p` panicked in export: boom"),
            "{e:?}"
        );
        assert!(sink
            .messages()
            .iter()
            .any(|m| m == "plugin method panicked"));
    }
}
