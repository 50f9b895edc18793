//! Rust log records into Python's `logging`, and shardport's Python warnings.
//!
//! # Log records
//! The host and every plugin log through `tracing` (plugins forward their
//! events to the host through the ABI's log callback). This module installs a
//! `tracing` subscriber (once per process, when the extension is imported)
//! whose events go to the `logging` logger `shardport.<target>` (`loader`,
//! `select`, `node`, `config`, `plugin`, ...), children of `shardport`, with
//! levels mapped (TRACE -> 5, DEBUG -> 10, INFO -> 20, WARN -> 30,
//! ERROR -> 40) and, for a plugin's event, the plugin's name in the record
//! (`record.plugin`, and `[name]` before the message) and the plugin's own
//! target (`record.source`, its module).
//!
//! # Why a queue
//! Events happen on any thread, most without the GIL: shardport calls run
//! with it released, and the http transport's server threads never hold it.
//! Taking the GIL inside an event could deadlock against a thread that holds
//! it while it waits for the one logging (a `close()` waiting for a fetch in
//! flight). So events are queued, bounded ([`QUEUE_MAX`]; what overflows is
//! counted and reported as one record), and handed to `logging` by the next
//! thread that returns from a shardport call holding the GIL ([`unlocked`]),
//! or by `shardport.flush_logs()`. Checking for queued records costs one
//! atomic load per call.
//!
//! # Levels
//! Events below the `shardport` logger's effective level are not even
//! formatted. That level is read when a node starts, when records are
//! forwarded, and by `flush_logs()`: lower the logger's level before starting
//! a node (or call `flush_logs()` after changing it). Each plugin library
//! keeps its own `tracing` callsite cache, which this process cannot
//! rebuild: a plugin's event first seen while the level was higher may stay
//! filtered after the level is lowered, so set the level before nodes start.
//!
//! # Re-entrancy
//! A `logging` handler may call shardport: its records are queued and wait
//! for the next forward (a thread never forwards inside a forward).
//!
//! # Warnings
//! [`warn`] raises Python warnings of the categories in `shardport.errors`
//! (`DowngradeWarning`, `ConfigWarning`): filters apply as usual (`-W
//! error::shardport.DowngradeWarning` turns a downgrade into an exception).

use std::{
    collections::VecDeque,
    fmt::Write as _,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering},
        Mutex,
    },
};

use pyo3::{
    prelude::*,
    sync::GILOnceCell,
    types::{PyDict, PyType},
};
use tracing::{
    field::{Field, Visit},
    subscriber::Interest,
    Event, Level, Metadata, Subscriber,
};
use tracing_subscriber::{filter::LevelFilter, layer::Context, prelude::*, Layer};

/// Most records waiting for a thread with the GIL; beyond it they are
/// dropped and counted (a burst of debug records from server threads while
/// Python is busy elsewhere must not grow without bound).
const QUEUE_MAX: usize = 4096;

/// The name of the root logger.
const LOGGER: &str = "shardport";

/// One event, formatted.
struct Record {
    /// Python `logging` level.
    level: u8,
    /// `tracing` target (`loader`, `select`, `plugin`...).
    target: &'static str,
    /// The plugin that logged it, for plugin events.
    plugin: Option<String>,
    /// The plugin's own target (its module), for plugin events.
    source: Option<String>,
    message: String,
}

static QUEUE: Mutex<VecDeque<Record>> = Mutex::new(VecDeque::new());
/// True while the queue may hold records (checked without the lock).
static PENDING: AtomicBool = AtomicBool::new(false);
/// Records dropped because the queue was full, not yet reported.
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// The lowest Python level that is captured (Python's default root level,
/// WARNING, until the logger is read).
static MIN_LEVEL: AtomicU8 = AtomicU8::new(30);

fn py_level(l: &Level) -> u8 {
    match *l {
        Level::TRACE => 5,
        Level::DEBUG => 10,
        Level::INFO => 20,
        Level::WARN => 30,
        _ => 40,
    }
}

/// The subscriber layer that queues events.
struct Queue;

fn wanted(level: &Level) -> bool {
    py_level(level) >= MIN_LEVEL.load(Ordering::Relaxed)
}

impl<S: Subscriber> Layer<S> for Queue {
    // Interest is cached per callsite and rebuilt when the level changes
    // (`sync_level`), so a disabled event costs what it costs without any
    // subscriber: one comparison with the static maximum level.
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if wanted(meta.level()) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        wanted(meta.level())
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(match MIN_LEVEL.load(Ordering::Relaxed) {
            0..=5 => LevelFilter::TRACE,
            6..=10 => LevelFilter::DEBUG,
            11..=20 => LevelFilter::INFO,
            21..=30 => LevelFilter::WARN,
            31..=40 => LevelFilter::ERROR,
            _ => LevelFilter::OFF,
        })
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        let mut v = Fields::default();
        event.record(&mut v);
        let record = Record {
            level: py_level(meta.level()),
            target: meta.target(),
            plugin: v.plugin,
            source: v.source,
            message: v.text + &v.rest,
        };
        let mut q = QUEUE.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= QUEUE_MAX {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        } else {
            q.push_back(record);
        }
        PENDING.store(true, Ordering::Release);
    }
}

/// The message, then `key=value` for every other field; a plugin's name
/// (the host's forwarded events carry `plugin`) kept apart.
#[derive(Default)]
struct Fields {
    text: String,
    plugin: Option<String>,
    source: Option<String>,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.text.push_str(value),
            "plugin" => self.plugin = Some(value.to_owned()),
            // A forwarded plugin event: `source` is the plugin's module
            // (kept as `record.source`), `fields` its own `key=value` list.
            "source" => self.source = Some(value.to_owned()),
            "fields" => {
                if !value.is_empty() {
                    let _ = write!(self.rest, " {value}");
                }
            }
            // The host's own name for the node adds nothing to a record.
            "node" => {}
            name => {
                let _ = write!(self.rest, " {name}={value}");
            }
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => {
                let _ = write!(self.text, "{value:?}");
            }
            "plugin" => self.plugin = Some(format!("{value:?}")),
            "node" => {}
            name => {
                let _ = write!(self.rest, " {name}={value:?}");
            }
        }
    }
}

/// Installs the subscriber, unless this process already has one (another
/// Rust extension's): then shardport's records stay with it.
pub(crate) fn install() {
    let subscriber = tracing_subscriber::registry().with(Queue);
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// Runs `f` with the GIL released, then forwards the records queued
/// meanwhile (by this or any other thread) to `logging`.
pub(crate) fn unlocked<T, F>(py: Python<'_>, f: F) -> T
where
    F: pyo3::marker::Ungil + FnOnce() -> T,
    T: pyo3::marker::Ungil,
{
    let out = py.allow_threads(f);
    if PENDING.load(Ordering::Acquire) {
        forward(py);
    }
    out
}

/// Hands every queued record to `logging`, then reads the `shardport`
/// logger's level again. A failure inside `logging` (a handler that raises)
/// is reported the way Python reports errors it cannot raise.
pub(crate) fn forward(py: Python<'_>) {
    thread_local! {
        /// Set while this thread hands records to `logging`: a handler that
        /// calls shardport again must not forward (nested, out of order,
        /// without bound); its records wait for the next forward.
        static FORWARDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if FORWARDING.with(|f| f.replace(true)) {
        return;
    }
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            FORWARDING.with(|f| f.set(false));
        }
    }
    let _reset = Reset;
    PENDING.store(false, Ordering::Release);
    let records: Vec<Record> = QUEUE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain(..)
        .collect();
    let dropped = DROPPED.swap(0, Ordering::Relaxed);
    if let Err(e) = emit(py, records, dropped) {
        e.write_unraisable(py, None);
    }
    sync_level(py);
}

fn emit(py: Python<'_>, records: Vec<Record>, dropped: u64) -> PyResult<()> {
    if records.is_empty() && dropped == 0 {
        return Ok(());
    }
    let get_logger = py.import("logging")?.getattr("getLogger")?;
    for r in records {
        let logger = get_logger.call1((format!("{LOGGER}.{}", r.target),))?;
        let extra = PyDict::new(py);
        let message = match &r.plugin {
            Some(p) => {
                extra.set_item("plugin", p)?;
                if let Some(s) = &r.source {
                    extra.set_item("source", s)?;
                }
                format!("[{p}] {}", r.message)
            }
            None => r.message,
        };
        let kwargs = PyDict::new(py);
        kwargs.set_item("extra", extra)?;
        logger.call_method("log", (r.level, message), Some(&kwargs))?;
    }
    if dropped > 0 {
        get_logger.call1((LOGGER,))?.call_method1(
            "warning",
            (format!(
                "{dropped} log records dropped: more than {QUEUE_MAX} waited for a thread holding the GIL"
            ),),
        )?;
    }
    Ok(())
}

/// Reads the `shardport` logger's effective level into the filter.
pub(crate) fn sync_level(py: Python<'_>) {
    let level = py
        .import("logging")
        .and_then(|m| m.getattr("getLogger")?.call1((LOGGER,)))
        .and_then(|l| l.call_method0("getEffectiveLevel")?.extract::<i64>());
    if let Ok(level) = level {
        let level = level.clamp(0, 255) as u8;
        if MIN_LEVEL.swap(level, Ordering::Relaxed) != level {
            tracing::callsite::rebuild_interest_cache();
        }
    }
}

/// `shardport.flush_logs()`: forwards queued records now and reads the
/// logger's level again (after `logging.getLogger("shardport").setLevel`).
#[pyfunction]
pub(crate) fn flush_logs(py: Python<'_>) {
    forward(py);
}

/// The warning categories of `shardport.errors`.
#[derive(Clone, Copy)]
pub(crate) enum Category {
    /// A faster transport failed or a view was asked and a copy served.
    Downgrade,
    /// A config key was not understood.
    Config,
}

/// Raises a Python warning of `category` (an exception when the filters
/// say so).
pub(crate) fn warn(py: Python<'_>, category: Category, message: &str) -> PyResult<()> {
    static DOWNGRADE: GILOnceCell<Py<PyType>> = GILOnceCell::new();
    static CONFIG: GILOnceCell<Py<PyType>> = GILOnceCell::new();
    let (cell, name) = match category {
        Category::Downgrade => (&DOWNGRADE, "DowngradeWarning"),
        Category::Config => (&CONFIG, "ConfigWarning"),
    };
    let cls = cell.import(py, "shardport.errors", name)?;
    // stacklevel 1: the caller's line (the Python wrapper methods call the
    // core directly from user code or from one level of `shardport`).
    let message = std::ffi::CString::new(message.replace('\0', " ")).unwrap_or_default();
    PyErr::warn(py, cls.as_any(), &message, 1)
}
