//! # shardport-spool-transport: a third-party transport, `spool-dir`
//!
//! A complete shardport transport plugin written against `shardport-abi`
//! alone, as an out-of-tree author would write one. It is deliberately
//! simple, and meant to be read: see `README.md` next to this crate for the
//! guide it illustrates.
//!
//! The owner writes each exported shard to its own file in a spool
//! directory, `<dir>/<node_tag>-<shard id hex>.shard` (created exclusively,
//! mode `0600`, written to a `.tmp` name and renamed, so a consumer never
//! sees a partial file). The descriptor carries the file name and length
//! ([`descriptor`]). The consumer reads the file from its own configured
//! directory, after validating the name and checking the file's size.
//! `unexport` deletes the file; dropping the instance deletes every file it
//! still owns. Owner and consumer must share the directory, so the
//! transport is `SAME_NODE_ONLY` and needs the owner's boot id to match.
//!
//! ```toml
//! [[plugin]]
//! name = "spool"
//! path = "libshardport_spool_transport.so"
//! [plugin.config]
//! dir = "/var/spool/shardport"   # required, absolute
//! fsync = false                  # fsync files and the directory before publishing
//! ```
//!
//! Start reading at [`SpoolTransport::new`] (config), then the
//! [`Transport`] impl: every method body runs inside
//! [`PluginContext::guard`], so a panic becomes an error, never an abort.

#![deny(unsafe_code)]

pub mod descriptor;

#[allow(unsafe_code)] // the one unsafe call of this crate, see `sys`
mod sys;
use sys::lent_bytes;

use std::{
    collections::HashMap,
    fs::{self, DirBuilder, File, OpenOptions},
    io::{self, Read, Write},
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex, MutexGuard, PoisonError,
    },
};

use shardport_abi::{
    export_plugin, AbiError, Allocation, Capabilities, ConfigTable, Device, ErrorKind,
    ExportRequest, Health, IdentityParts, ImportInfo, LogLevel, LogRecord, PluginContext,
    PluginResult, RResult, RSlice, RSliceMut, RStr, RVec, Region, ShardId, ShardMeta, Stat,
    TD_Opaque, Transport, TransportBox, TransportInfo,
};

use crate::descriptor::{shard_file_name, validate_file_name, Descriptor, TMP_SUFFIX};

/// The transport name descriptors are filed under.
pub const TRANSPORT_NAME: &str = "spool-dir";

/// Default of `fsync`: off. Consumers only ever see renamed, complete files,
/// so fsync buys durability across a machine crash, which shards (gone with
/// their owner process anyway) do not need; it costs a disk flush per put.
pub const DEFAULT_FSYNC: bool = false;

/// `tracing`-style target of the records this plugin sends to the host.
const LOG_TARGET: &str = "spool_dir";

/// Builds a `spool-dir` instance; the plugin's constructor.
pub fn create(ctx: PluginContext) -> PluginResult<TransportBox> {
    Ok(TransportBox::from_value(
        SpoolTransport::new(ctx)?,
        TD_Opaque,
    ))
}

export_plugin! {
    name: TRANSPORT_NAME,
    version: env!("CARGO_PKG_VERSION"),
    new: create,
}

/// One `spool-dir` instance: the owner side of the files it wrote, and a
/// reader of any valid file in its directory.
pub struct SpoolTransport {
    ctx: PluginContext,
    dir: PathBuf,
    fsync: bool,
    /// Shards this instance exported, by id. The only record of which files
    /// are ours: `unexport` and `Drop` delete nothing else.
    owned: Mutex<HashMap<ShardId, Owned>>,
    counters: Counters,
}

/// A file this instance wrote (or is writing).
struct Owned {
    file_name: String,
    byte_len: u64,
    /// False while `export` is still writing it: `unexport` refuses it then.
    published: bool,
}

#[derive(Default)]
struct Counters {
    exports: AtomicU64,
    unexports: AtomicU64,
    imports: AtomicU64,
    import_errors: AtomicU64,
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
}

impl SpoolTransport {
    /// Reads the config table (`dir`, required and absolute; `fsync`),
    /// refusing unknown keys, and creates the directory (mode `0700`) when it
    /// does not exist yet. Errors are `CONFIG` and name the key.
    pub fn new(ctx: PluginContext) -> PluginResult<Self> {
        let instance = ctx.instance().to_owned();
        let key = |k: &str| format!("plugin.{instance}.config.{k}");
        let table = ConfigTable::parse(&instance, ctx.config())?;
        let dir = table.opt_string("dir")?.ok_or_else(|| {
            AbiError::config(format!(
                "`{}` is required: the spool directory owner and consumers share, \
                 e.g. dir = \"/var/spool/shardport\"",
                key("dir")
            ))
        })?;
        let fsync = table.bool("fsync", DEFAULT_FSYNC)?;
        table.finish()?;

        let dir = PathBuf::from(dir);
        if !dir.is_absolute() {
            return Err(AbiError::config(format!(
                "`{}`: expected an absolute path (owner and consumer processes may run \
                 in different directories), found \"{}\"",
                key("dir"),
                dir.display()
            )));
        }
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| {
                AbiError::config(format!(
                    "`{}`: cannot create spool directory `{}`: {e}",
                    key("dir"),
                    dir.display()
                ))
            })?;
        if !dir.is_dir() {
            return Err(AbiError::config(format!(
                "`{}`: `{}` is not a directory",
                key("dir"),
                dir.display()
            )));
        }
        // Our own names must pass the check consumers apply to them.
        let probe = shard_file_name(ctx.node_tag(), ShardId::from_u128(u128::MAX));
        validate_file_name(&probe).map_err(|why| {
            AbiError::internal(format!(
                "the host's node tag {:?} makes unusable file names: {why}",
                ctx.node_tag()
            ))
        })?;

        let t = SpoolTransport {
            ctx,
            dir,
            fsync,
            owned: Mutex::default(),
            counters: Counters::default(),
        };
        t.log(
            LogLevel::INFO,
            "spool directory ready",
            &format!("dir={:?} fsync={fsync}", t.dir.display().to_string()),
        );
        Ok(t)
    }

    /// The spool directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn info() -> TransportInfo {
        TransportInfo {
            name: TRANSPORT_NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            capabilities: Capabilities::CPU.with(Capabilities::SAME_NODE_ONLY),
            needs_identity: IdentityParts::BOOT_ID,
        }
    }

    /// The owned-files table. A panic elsewhere never leaves it half-updated
    /// (every update is one insert or remove), so a poisoned lock is used as is.
    fn owned(&self) -> MutexGuard<'_, HashMap<ShardId, Owned>> {
        self.owned.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends a record to the host's log sink. Events from the `tracing` crate
    /// inside `guard` are forwarded the same way; this crate depends on
    /// `shardport-abi` alone, so it calls the sink directly.
    fn log(&self, level: LogLevel, message: &str, fields: &str) {
        let services = self.ctx.services();
        if services.log_enabled(level, RStr::from(LOG_TARGET)) {
            services.log(LogRecord {
                level,
                target: RStr::from(LOG_TARGET),
                message: RStr::from(message),
                fields: RStr::from(fields),
            });
        }
    }

    fn export_inner(&self, req: &ExportRequest) -> PluginResult<Vec<u8>> {
        let len = req.data.len();
        if req.meta.byte_len != len as u64 {
            return Err(AbiError::invalid_argument(format!(
                "shard {}: meta.byte_len is {} but {len} bytes were lent",
                req.id, req.meta.byte_len
            )));
        }
        if req.meta.device != Device::CPU {
            return Err(AbiError::invalid_argument(format!(
                "shard {} lives on {}: spool-dir moves cpu shards only",
                req.id, req.meta.device
            )));
        }
        if req.allocation != 0 {
            return Err(AbiError::invalid_argument(format!(
                "shard {}: allocation token {} is not ours (spool-dir hands out no allocations)",
                req.id, req.allocation
            )));
        }
        let file_name = shard_file_name(self.ctx.node_tag(), req.id);
        {
            let mut owned = self.owned();
            if owned.contains_key(&req.id) {
                return Err(AbiError::invalid_argument(format!(
                    "shard {} is already exported",
                    req.id
                )));
            }
            owned.insert(
                req.id,
                Owned {
                    file_name: file_name.clone(),
                    byte_len: len as u64,
                    published: false,
                },
            );
        }
        match self.write_file(&file_name, lent_bytes(req)) {
            Ok(()) => {
                if let Some(o) = self.owned().get_mut(&req.id) {
                    o.published = true;
                }
            }
            Err(e) => {
                self.owned().remove(&req.id);
                return Err(e);
            }
        }
        self.counters.exports.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_written
            .fetch_add(len as u64, Ordering::Relaxed);
        self.log(
            LogLevel::DEBUG,
            "exported",
            &format!("shard={} file={file_name:?} bytes={len}", req.id),
        );
        Ok(Descriptor {
            file_name,
            byte_len: len as u64,
        }
        .encode())
    }

    /// Writes `bytes` to `<dir>/<name>.tmp` (exclusively, `0600`) and renames
    /// it to `<dir>/<name>`; removes the temporary file on failure.
    fn write_file(&self, name: &str, bytes: &[u8]) -> PluginResult<()> {
        let tmp = self.dir.join(format!("{name}{TMP_SUFFIX}"));
        let path = self.dir.join(name);
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io_error(format_args!("cannot create `{}`", tmp.display()), &e))
            .and_then(|mut f| {
                f.write_all(bytes)
                    .map_err(|e| io_error(format_args!("cannot write `{}`", tmp.display()), &e))?;
                if self.fsync {
                    f.sync_all().map_err(|e| {
                        io_error(format_args!("cannot fsync `{}`", tmp.display()), &e)
                    })?;
                }
                Ok(())
            })
            .and_then(|()| {
                fs::rename(&tmp, &path).map_err(|e| {
                    io_error(
                        format_args!("cannot rename `{}` to `{}`", tmp.display(), path.display()),
                        &e,
                    )
                })
            });
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        if self.fsync {
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| {
                    io_error(
                        format_args!("cannot fsync directory `{}`", self.dir.display()),
                        &e,
                    )
                })?;
        }
        Ok(())
    }

    fn import_inner(&self, desc: &[u8], meta: &ShardMeta, dst: &mut [u8]) -> PluginResult<String> {
        if dst.len() as u64 != meta.byte_len {
            return Err(AbiError::invalid_argument(format!(
                "destination holds {} bytes, the shard has {}",
                dst.len(),
                meta.byte_len
            )));
        }
        if meta.device != Device::CPU {
            return Err(AbiError::invalid_argument(format!(
                "shard lives on {}: spool-dir moves cpu shards only",
                meta.device
            )));
        }
        let d = Descriptor::decode(desc)?;
        if d.byte_len != meta.byte_len {
            return Err(AbiError::invalid_descriptor(format!(
                "descriptor says {} bytes, meta says {}",
                d.byte_len, meta.byte_len
            )));
        }
        let path = self.dir.join(&d.file_name);
        let gone = || {
            AbiError::not_found(format!(
                "`{}` is not in the spool directory (unexported, or its owner is gone)",
                path.display()
            ))
        };
        // Refuse symlinks: the file must be one an owner wrote here.
        match fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_file() => {}
            Ok(_) => {
                return Err(AbiError::invalid_descriptor(format!(
                    "`{}` is not a regular file",
                    path.display()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(gone()),
            Err(e) => {
                return Err(io_error(
                    format_args!("cannot stat `{}`", path.display()),
                    &e,
                ))
            }
        }
        // Once open, the owner may unlink it: the open file still reads whole.
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(gone()),
            Err(e) => {
                return Err(io_error(
                    format_args!("cannot open `{}`", path.display()),
                    &e,
                ))
            }
        };
        let size = file
            .metadata()
            .map_err(|e| io_error(format_args!("cannot stat `{}`", path.display()), &e))?
            .len();
        if size != d.byte_len {
            return Err(AbiError::invalid_descriptor(format!(
                "`{}` holds {size} bytes, the descriptor says {}",
                path.display(),
                d.byte_len
            )));
        }
        file.read_exact(dst)
            .map_err(|e| io_error(format_args!("cannot read `{}`", path.display()), &e))?;
        Ok(d.file_name)
    }

    fn unexport_inner(&self, id: ShardId) -> PluginResult<()> {
        let entry = {
            let mut owned = self.owned();
            match owned.get(&id).map(|o| o.published) {
                None => {
                    return Err(AbiError::not_found(format!(
                        "shard {id} is not exported by this spool-dir instance"
                    )))
                }
                Some(false) => {
                    return Err(AbiError::not_found(format!(
                        "shard {id} is still being exported"
                    )))
                }
                Some(true) => owned.remove(&id),
            }
        };
        let Some(entry) = entry else {
            return Err(AbiError::internal("owned entry vanished under the lock"));
        };
        let path = self.dir.join(&entry.file_name);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => self.log(
                LogLevel::WARN,
                "shard file already gone at unexport",
                &format!("shard={id} file={:?}", entry.file_name),
            ),
            Err(e) => {
                let err = io_error(format_args!("cannot delete `{}`", path.display()), &e);
                // Keep it ours, so a retry or `Drop` deletes it.
                self.owned().insert(id, entry);
                return Err(err);
            }
        }
        self.counters.unexports.fetch_add(1, Ordering::Relaxed);
        self.log(
            LogLevel::DEBUG,
            "unexported",
            &format!("shard={id} file={:?}", entry.file_name),
        );
        Ok(())
    }
}

/// An `AbiError` for a failed file operation: `RESOURCE_EXHAUSTED` for a
/// full disk, otherwise the kind [`AbiError::io`] picks.
fn io_error(what: std::fmt::Arguments<'_>, e: &io::Error) -> AbiError {
    if e.kind() == io::ErrorKind::StorageFull {
        AbiError::new(ErrorKind::RESOURCE_EXHAUSTED, format!("{what}: {e}"))
    } else {
        AbiError::io(what, e)
    }
}

impl Transport for SpoolTransport {
    fn describe(&self) -> TransportInfo {
        self.ctx
            .guard_infallible("describe", Self::info(), Self::info)
    }

    fn export(&self, req: ExportRequest) -> RResult<RVec<u8>, AbiError> {
        self.ctx
            .guard("export", || self.export_inner(&req).map(RVec::from))
    }

    fn unexport(&self, id: ShardId) -> RResult<(), AbiError> {
        self.ctx.guard("unexport", || self.unexport_inner(id))
    }

    fn import_into(
        &self,
        desc: RSlice<'_, u8>,
        meta: &ShardMeta,
        mut dst: RSliceMut<'_, u8>,
    ) -> RResult<ImportInfo, AbiError> {
        self.ctx.guard("import_into", || {
            match self.import_inner(&desc, meta, &mut dst) {
                Ok(file_name) => {
                    self.counters.imports.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .bytes_read
                        .fetch_add(meta.byte_len, Ordering::Relaxed);
                    Ok(ImportInfo {
                        note: format!("read {file_name}").into(),
                    })
                }
                Err(e) => {
                    self.counters.import_errors.fetch_add(1, Ordering::Relaxed);
                    self.log(LogLevel::DEBUG, "import failed", &format!("error={e}"));
                    Err(e)
                }
            }
        })
    }

    fn import_view(&self, _desc: RSlice<'_, u8>, _meta: &ShardMeta) -> RResult<Region, AbiError> {
        self.ctx.guard("import_view", || {
            Err(AbiError::unsupported(
                "spool-dir has no zero-copy path: use import_into",
            ))
        })
    }

    fn release(&self, token: u64) -> RResult<(), AbiError> {
        self.ctx.guard("release", || {
            Err(AbiError::unsupported(format!(
                "spool-dir hands out no leases (release of token {token})"
            )))
        })
    }

    fn allocate(&self, id: ShardId, _len: u64) -> RResult<Allocation, AbiError> {
        self.ctx.guard("allocate", || {
            Err(AbiError::unsupported(format!(
                "spool-dir has no allocator (shard {id}): use storage policy `heap`"
            )))
        })
    }

    fn free_allocation(&self, token: u64) -> RResult<(), AbiError> {
        self.ctx.guard("free_allocation", || {
            Err(AbiError::unsupported(format!(
                "spool-dir hands out no allocations (free of token {token})"
            )))
        })
    }

    fn stats(&self) -> RVec<Stat> {
        self.ctx.guard_infallible("stats", RVec::new(), || {
            let (shards, bytes) = {
                let owned = self.owned();
                let bytes = owned.values().map(|o| o.byte_len).sum();
                (owned.len() as u64, bytes)
            };
            let c = &self.counters;
            let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
            RVec::from(vec![
                Stat::counter("exports_total", n(&c.exports)),
                Stat::counter("unexports_total", n(&c.unexports)),
                Stat::counter("imports_total", n(&c.imports)),
                Stat::counter("import_errors_total", n(&c.import_errors)),
                Stat::counter("bytes_written_total", n(&c.bytes_written)),
                Stat::counter("bytes_read_total", n(&c.bytes_read)),
                Stat::gauge("shards_exported", shards),
                Stat::gauge("bytes_exported", bytes),
            ])
        })
    }

    fn health(&self) -> Health {
        let panicked = Health {
            ok: false,
            message: "health check panicked".into(),
        };
        self.ctx
            .guard_infallible("health", panicked, || match fs::metadata(&self.dir) {
                Ok(m) if m.is_dir() => Health {
                    ok: true,
                    message: format!("spool directory `{}`", self.dir.display()).into(),
                },
                Ok(_) => Health {
                    ok: false,
                    message: format!("`{}` is no longer a directory", self.dir.display()).into(),
                },
                Err(e) => Health {
                    ok: false,
                    message: format!("spool directory `{}`: {e}", self.dir.display()).into(),
                },
            })
    }
}

impl Drop for SpoolTransport {
    /// Deletes every file this instance still owns (and a temporary file of
    /// an export that never finished). Runs inside `guard_infallible`: a
    /// panic in `Drop` would otherwise abort the host.
    fn drop(&mut self) {
        self.ctx.guard_infallible("drop", (), || {
            let owned = std::mem::take(&mut *self.owned());
            for (id, o) in owned {
                let name = if o.published {
                    o.file_name
                } else {
                    format!("{}{TMP_SUFFIX}", o.file_name)
                };
                match fs::remove_file(self.dir.join(&name)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => self.log(
                        LogLevel::WARN,
                        "cannot delete shard file at shutdown",
                        &format!("shard={id} file={name:?} error={e:?}"),
                    ),
                }
            }
        });
    }
}

#[cfg(test)]
mod tests;
