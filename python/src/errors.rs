//! Rust errors as Python exceptions. The classes live in `shardport.errors`
//! (pure Python, so they can also subclass `ValueError`, `KeyError`,
//! `TypeError`); this module raises them by name.

use pyo3::{prelude::*, sync::GILOnceCell, types::PyType};
use shardport_abi::ErrorKind;
use shardport_host::HostError;

/// Which exception class to raise.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Base,
    Config,
    InvalidInput,
    Unsupported,
    BadHandle,
    NotFound,
    Integrity,
    Transport,
    TransportUnavailable,
    Storage,
    Closed,
    PermissionDenied,
    BadManifest,
    StaleVersion,
}

impl Kind {
    fn class_name(self) -> &'static str {
        match self {
            Kind::Base => "ShardportError",
            Kind::Config => "ConfigError",
            Kind::InvalidInput => "InvalidInputError",
            Kind::Unsupported => "UnsupportedObjectError",
            Kind::BadHandle => "BadHandleError",
            Kind::NotFound => "NotFoundError",
            Kind::Integrity => "IntegrityError",
            Kind::Transport => "TransportError",
            Kind::TransportUnavailable => "TransportUnavailableError",
            Kind::Closed => "ClosedError",
            Kind::Storage => "StorageError",
            Kind::PermissionDenied => "PermissionDeniedError",
            Kind::BadManifest => "BadManifestError",
            Kind::StaleVersion => "StaleVersionError",
        }
    }
}

static ERRORS: GILOnceCell<Py<PyModule>> = GILOnceCell::new();

/// An exception of `kind` carrying `msg`.
pub(crate) fn py_err(kind: Kind, msg: impl Into<String>) -> PyErr {
    let msg = msg.into();
    Python::with_gil(|py| {
        let class = ERRORS
            .get_or_try_init(py, || py.import("shardport.errors").map(Bound::unbind))
            .and_then(|m| m.bind(py).getattr(kind.class_name()))
            .and_then(|c| c.downcast_into::<PyType>().map_err(PyErr::from));
        match class {
            Ok(c) => PyErr::from_type(c, msg),
            Err(e) => e,
        }
    })
}

/// A host error as the matching exception, with the host's message.
pub(crate) fn host_err(e: HostError) -> PyErr {
    py_err(host_kind(&e), e.to_string())
}

/// The exception class of a host error.
pub(crate) fn host_kind(e: &HostError) -> Kind {
    match e {
        HostError::InvalidShard(_) | HostError::BatchTooLarge { .. } => Kind::InvalidInput,
        HostError::NotOwned(_) => Kind::NotFound,
        HostError::Storage { .. } => Kind::Storage,
        HostError::ChecksumMismatch { .. } => Kind::Integrity,
        HostError::ReloadRefused(_) | HostError::PluginConfig(_) => Kind::Config,
        HostError::RequiredPlugins(_)
        | HostError::NoExport { .. }
        | HostError::NoDeviceTransport { .. }
        | HostError::NoCandidate { .. } => Kind::TransportUnavailable,
        HostError::FetchFailed { failures, .. }
            if !failures.is_empty()
                && failures.iter().all(|(_, f)| f.kind == ErrorKind::NOT_FOUND) =>
        {
            Kind::NotFound
        }
        HostError::FetchFailed { .. } | HostError::Downgrade { .. } => Kind::Transport,
        _ => Kind::Base,
    }
}
