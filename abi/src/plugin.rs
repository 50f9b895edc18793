//! Plugin-side helpers: panic-safe entry points and log forwarding.
//!
//! A panic must never cross the boundary (abi_stable would abort the host), so
//! every method body of a `Transport` implementation runs inside
//! [`PluginContext::guard`]. The same call makes sure the calling thread's
//! `tracing` dispatcher is the instance's, which forwards the plugin's
//! events to the host: a cdylib's `tracing` globals are its own and would
//! otherwise drop them. The dispatcher is per thread, not global, so two host
//! nodes in one process that load the same plugin each receive their own
//! instance's events. A thread keeps the dispatcher of the instance it last
//! called until it calls another one (installing it per call, and putting
//! the previous one back after, cost ~50 ns of a 0.6 us put: two atomic
//! counters and an `Arc` shared by every thread). Consequences: events a
//! plugin emits on a host thread outside any call (a `Drop` the host runs)
//! reach the instance that thread called last; a call of one instance
//! nested in another's on the same thread (nothing does this today) would
//! leave the inner one's dispatcher installed for the rest of the outer
//! call; a plugin linked in-process as a Rust library (tests, benches)
//! keeps its dispatcher installed on the calling thread.

use std::{
    any::Any,
    cell::RefCell,
    fmt::Write as _,
    panic::{catch_unwind, AssertUnwindSafe},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use abi_stable::std_types::{RResult, RStr};
use tracing::{field::Field, Dispatch, Level, Subscriber};
use tracing_subscriber::{layer::Context, prelude::*, registry::LookupSpan, Layer, Registry};

use crate::{
    error::{AbiError, ErrorKind, PluginResult},
    host::{HostContext, HostServicesBox, LogLevel, LogRecord},
};

/// Per-instance plugin state every transport keeps: host services and the
/// forwarding dispatcher. Cheap to clone.
#[derive(Clone)]
pub struct PluginContext {
    instance: Arc<str>,
    config: Arc<str>,
    node_name: Arc<str>,
    node_tag: Arc<str>,
    services: Arc<HostServicesBox>,
    dispatch: Dispatch,
    /// Identifies `dispatch` (shared by clones) in [`INSTALLED`].
    dispatch_id: u64,
}

/// Source of [`PluginContext::dispatch_id`]s (never 0).
static NEXT_DISPATCH: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The dispatcher this thread has as its default, by id, and the guard
    /// that puts back the one before it (when the thread exits, or another
    /// instance's is installed).
    static INSTALLED: RefCell<Option<(u64, tracing::dispatcher::DefaultGuard)>> =
        const { RefCell::new(None) };
}

impl std::fmt::Debug for PluginContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginContext")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl PluginContext {
    /// Builds the context from what the host passed to the constructor.
    pub fn new(ctx: HostContext) -> Self {
        let services = Arc::new(ctx.services);
        let layer = ForwardLayer {
            services: Arc::clone(&services),
        };
        PluginContext {
            instance: ctx.instance.as_str().into(),
            config: ctx.config.as_str().into(),
            node_name: ctx.node_name.as_str().into(),
            node_tag: ctx.node_tag.as_str().into(),
            services,
            dispatch: Dispatch::new(Registry::default().with(layer)),
            dispatch_id: NEXT_DISPATCH.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Runs `f` with this instance's dispatcher as the thread's default:
    /// installed once per thread and kept (see the module docs); scoped to
    /// the call where the thread's storage is already gone (thread exit).
    fn logged<T>(&self, f: impl FnOnce() -> T) -> T {
        let installed = INSTALLED.try_with(|slot| {
            let Ok(mut slot) = slot.try_borrow_mut() else {
                return false;
            };
            if slot.as_ref().map(|(id, _)| *id) != Some(self.dispatch_id) {
                // Put the previous instance's back first, then install ours.
                *slot = None;
                *slot = Some((
                    self.dispatch_id,
                    tracing::dispatcher::set_default(&self.dispatch),
                ));
            }
            true
        });
        if installed == Ok(true) {
            f()
        } else {
            tracing::dispatcher::with_default(&self.dispatch, f)
        }
    }

    /// The configured instance name.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// This plugin's config table as TOML text (empty when none was given).
    pub fn config(&self) -> &str {
        &self.config
    }

    /// The host node's name.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// A tag unique to the host node instance, safe in OS resource names.
    pub fn node_tag(&self) -> &str {
        &self.node_tag
    }

    /// Host services (clock, raw log sink).
    pub fn services(&self) -> &HostServicesBox {
        &self.services
    }

    /// Wall clock from the host, nanoseconds since the Unix epoch.
    pub fn now_unix_nanos(&self) -> u64 {
        self.services.now_unix_nanos()
    }

    /// Runs `f` with this instance's log forwarding installed and turns a
    /// panic into an [`ErrorKind::PANIC`] error naming `op`.
    pub fn guard<T>(&self, op: &str, f: impl FnOnce() -> PluginResult<T>) -> RResult<T, AbiError> {
        self.logged(|| match catch_unwind(AssertUnwindSafe(f)) {
            Ok(r) => r.into(),
            Err(payload) => {
                let msg = panic_message(&*payload);
                tracing::error!(op, panic = %msg, "plugin method panicked");
                RResult::RErr(AbiError::new(
                    ErrorKind::PANIC,
                    format!("plugin `{}` panicked in {op}: {msg}", self.instance),
                ))
            }
        })
    }

    /// Like [`guard`](Self::guard) for methods that cannot return an error:
    /// a panic is logged and `fallback` is returned instead.
    pub fn guard_infallible<T>(&self, op: &str, fallback: T, f: impl FnOnce() -> T) -> T {
        match self.guard(op, || Ok(f())) {
            RResult::ROk(v) => v,
            RResult::RErr(_) => fallback,
        }
    }
}

/// Runs a plugin constructor panic-safely (used by [`export_plugin!`](crate::export_plugin)).
pub fn guard_constructor<T>(
    ctx: HostContext,
    f: impl FnOnce(PluginContext) -> PluginResult<T>,
) -> RResult<T, AbiError> {
    let pctx = PluginContext::new(ctx);
    pctx.clone().guard("new_transport", || f(pctx))
}

/// Text of a panic payload.
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

fn to_log_level(level: &Level) -> LogLevel {
    match *level {
        Level::TRACE => LogLevel::TRACE,
        Level::DEBUG => LogLevel::DEBUG,
        Level::INFO => LogLevel::INFO,
        Level::WARN => LogLevel::WARN,
        _ => LogLevel::ERROR,
    }
}

/// A `tracing` layer that forwards every event to the host's log sink.
struct ForwardLayer {
    services: Arc<HostServicesBox>,
}

impl<S> Layer<S> for ForwardLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn enabled(&self, metadata: &tracing::Metadata<'_>, _ctx: Context<'_, S>) -> bool {
        // Spans are kept (cheap) so events inside them keep their context.
        metadata.is_span()
            || self.services.log_enabled(
                to_log_level(metadata.level()),
                RStr::from(metadata.target()),
            )
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut visitor = FieldText::default();
        event.record(&mut visitor);
        // Prefix the names of the enclosing spans, outermost first.
        if let Some(scope) = ctx.event_scope(event) {
            let names: Vec<&str> = scope.from_root().map(|s| s.name()).collect();
            if !names.is_empty() {
                let _ = write!(visitor.fields, " span={}", names.join(":"));
            }
        }
        let meta = event.metadata();
        self.services.log(LogRecord {
            level: to_log_level(meta.level()),
            target: RStr::from(meta.target()),
            message: RStr::from(visitor.message.as_str()),
            fields: RStr::from(visitor.fields.trim_start()),
        });
    }
}

#[derive(Default)]
struct FieldText {
    message: String,
    fields: String,
}

impl tracing::field::Visit for FieldText {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}
