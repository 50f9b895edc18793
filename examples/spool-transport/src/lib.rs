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
//! still owns. A consumer may also map the file read-only and hand out a
//! zero-copy view (`import_view`): an unlinked file stays mapped, so a view
//! outlives `unexport`. Owner and consumer must share the directory, so the
//! transport is `SAME_NODE_ONLY` and needs the owner's boot id to match.
//!
//! What every transport repeats comes from `shardport_kit`: options
//! ([`Options`]), the descriptor codec, counters, I/O error context, the
//! read-only mapping and its lease table. The crate's only `unsafe` (two
//! calls) is in `sys`.
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
//! [`PlainTransport`] impl: `kit::Guarded` runs every method body inside
//! [`PluginContext::guard`], so a panic becomes an error, never an abort.

#![deny(unsafe_code)]

pub mod descriptor;

#[allow(unsafe_code)] // the two unsafe calls of this crate, see `sys`
mod sys;

use std::{
    collections::HashMap,
    fs::{self, DirBuilder, File, OpenOptions},
    io::{self, Read, Write},
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
};

use shardport_abi::{
    export_plugin, AbiError, Capabilities, Device, ExportRequest, Health, IdentityParts,
    ImportInfo, LogLevel, LogRecord, PluginContext, PluginResult, RStr, Region, ShardId, ShardMeta,
    Stat, TransportBox, TransportInfo,
};
use shardport_kit::{
    self as kit,
    map::{LeaseTable, ReadOnlyMap},
    Counter, IoContext, Options, PlainTransport, StatList,
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
    Ok(kit::into_transport_box(SpoolTransport::new(ctx)?))
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
    /// Zero-copy views handed out, each keeping its file mapped.
    views: LeaseTable<Arc<ReadOnlyMap>>,
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
    exports: Counter,
    unexports: Counter,
    /// Copies and views.
    imports: Counter,
    import_errors: Counter,
    bytes_written: Counter,
    /// Bytes copied out, or mapped for a view.
    bytes_read: Counter,
}

impl SpoolTransport {
    /// Reads the config table (`dir`, required and absolute; `fsync`),
    /// refusing unknown keys, and creates the directory (mode `0700`) when it
    /// does not exist yet. Errors are `CONFIG` and name the key.
    pub fn new(ctx: PluginContext) -> PluginResult<Self> {
        let table = Options::parse(ctx.instance(), ctx.config())?;
        let dir = table.required_string(
            "dir",
            "dir = \"/var/spool/shardport\" (the directory owner and consumers share)",
        )?;
        let fsync = table.bool("fsync", DEFAULT_FSYNC)?;

        let dir = PathBuf::from(dir);
        if !dir.is_absolute() {
            return Err(table.fail(
                "dir",
                format_args!(
                    "expected an absolute path (owner and consumer processes may run \
                     in different directories), found \"{}\"",
                    dir.display()
                ),
            ));
        }
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| {
                table.fail(
                    "dir",
                    format_args!("cannot create spool directory `{}`: {e}", dir.display()),
                )
            })?;
        if !dir.is_dir() {
            return Err(table.fail(
                "dir",
                format_args!("`{}` is not a directory", dir.display()),
            ));
        }
        table.finish()?;
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
            views: LeaseTable::new(TRANSPORT_NAME),
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
            capabilities: Capabilities::CPU
                .with(Capabilities::SAME_NODE_ONLY)
                .with(Capabilities::ZERO_COPY),
            needs_identity: IdentityParts::BOOT_ID,
        }
    }

    /// The owned-files table. A panic elsewhere never leaves it half-updated
    /// (every update is one insert or remove), so a poisoned lock is used as is.
    fn owned(&self) -> MutexGuard<'_, HashMap<ShardId, Owned>> {
        kit::lock(&self.owned)
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
        let bytes = sys::export_bytes(req)?;
        let len = bytes.len();
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
        match self.write_file(&file_name, &bytes) {
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
        self.counters.exports.inc();
        self.counters.bytes_written.add(len as u64);
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
            .with_context(|| format!("cannot create `{}`", tmp.display()))
            .and_then(|mut f| {
                f.write_all(bytes)
                    .with_context(|| format!("cannot write `{}`", tmp.display()))?;
                if self.fsync {
                    f.sync_all()
                        .with_context(|| format!("cannot fsync `{}`", tmp.display()))?;
                }
                Ok(())
            })
            .and_then(|()| {
                fs::rename(&tmp, &path).with_context(|| {
                    format!("cannot rename `{}` to `{}`", tmp.display(), path.display())
                })
            });
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        if self.fsync {
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .with_context(|| format!("cannot fsync directory `{}`", self.dir.display()))?;
        }
        Ok(())
    }

    /// Validates the request and the descriptor, and opens the named file
    /// after checking it is a regular file of the descriptor's length.
    fn open_shard(&self, desc: &[u8], meta: &ShardMeta) -> PluginResult<(File, Descriptor)> {
        if meta.device != Device::CPU {
            return Err(AbiError::invalid_argument(format!(
                "shard lives on {}: spool-dir moves cpu shards only",
                meta.device
            )));
        }
        let d = Descriptor::decode(desc)?;
        kit::check::declared_len("spool-dir descriptor", "byte_len", d.byte_len, meta)?;
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
                return Err(kit::error::io_error(
                    format_args!("cannot stat `{}`", path.display()),
                    &e,
                ))
            }
        }
        // Once open, the owner may unlink it: the open file still reads whole.
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(gone()),
            Err(e) => {
                return Err(kit::error::io_error(
                    format_args!("cannot open `{}`", path.display()),
                    &e,
                ))
            }
        };
        let size = file
            .metadata()
            .with_context(|| format!("cannot stat `{}`", path.display()))?
            .len();
        if size != d.byte_len {
            return Err(AbiError::invalid_descriptor(format!(
                "`{}` holds {size} bytes, the descriptor says {}",
                path.display(),
                d.byte_len
            )));
        }
        Ok((file, d))
    }

    fn import_inner(&self, desc: &[u8], meta: &ShardMeta, dst: &mut [u8]) -> PluginResult<String> {
        kit::check::destination(dst.len(), meta)?;
        let (mut file, d) = self.open_shard(desc, meta)?;
        file.read_exact(dst)
            .with_context(|| format!("cannot read `{}`", self.dir.join(&d.file_name).display()))?;
        Ok(d.file_name)
    }

    /// Maps the shard's file read-only and leases a view of it; the lease
    /// keeps the mapping (and so the bytes, even once the file is unlinked)
    /// until `release`.
    fn view_inner(&self, desc: &[u8], meta: &ShardMeta) -> PluginResult<Region> {
        let (file, d) = self.open_shard(desc, meta)?;
        let map = sys::map_shard_file(&file)
            .with_context(|| format!("cannot map `{}`", self.dir.join(&d.file_name).display()))?;
        self.views.grant(Arc::new(map), 0, d.byte_len)
    }

    /// Counts one import's outcome.
    fn count<T>(&self, r: PluginResult<T>, len: u64) -> PluginResult<T> {
        match &r {
            Ok(_) => {
                self.counters.imports.inc();
                self.counters.bytes_read.add(len);
            }
            Err(e) => {
                self.counters.import_errors.inc();
                self.log(LogLevel::DEBUG, "import failed", &format!("error={e}"));
            }
        }
        r
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
                let err =
                    kit::error::io_error(format_args!("cannot delete `{}`", path.display()), &e);
                // Keep it ours, so a retry or `Drop` deletes it.
                self.owned().insert(id, entry);
                return Err(err);
            }
        }
        self.counters.unexports.inc();
        self.log(
            LogLevel::DEBUG,
            "unexported",
            &format!("shard={id} file={:?}", entry.file_name),
        );
        Ok(())
    }
}

/// The transport, in plain types: `kit::Guarded` runs each method under
/// [`PluginContext::guard`] (a panic becomes an error, never an abort) and
/// supplies the `UNSUPPORTED` answers for the allocator.
impl PlainTransport for SpoolTransport {
    const NAME: &'static str = TRANSPORT_NAME;

    fn context(&self) -> &PluginContext {
        &self.ctx
    }

    fn describe(&self) -> TransportInfo {
        Self::info()
    }

    fn export(&self, req: &ExportRequest) -> PluginResult<Vec<u8>> {
        self.export_inner(req)
    }

    fn unexport(&self, id: ShardId) -> PluginResult<()> {
        self.unexport_inner(id)
    }

    fn import_into(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        dst: &mut [u8],
    ) -> PluginResult<ImportInfo> {
        let r = self.import_inner(desc, meta, dst);
        self.count(r, meta.byte_len).map(|file_name| ImportInfo {
            note: format!("read {file_name}").into(),
        })
    }

    fn import_view(&self, desc: &[u8], meta: &ShardMeta) -> PluginResult<Region> {
        self.count(self.view_inner(desc, meta), meta.byte_len)
    }

    fn release(&self, token: u64) -> PluginResult<()> {
        self.views.release(token).map(drop)
    }

    fn stats(&self) -> Vec<Stat> {
        let (shards, bytes) = {
            let owned = self.owned();
            let bytes = owned.values().map(|o| o.byte_len).sum();
            (owned.len() as u64, bytes)
        };
        let c = &self.counters;
        StatList::new()
            .counter("exports_total", &c.exports)
            .counter("unexports_total", &c.unexports)
            .counter("imports_total", &c.imports)
            .counter("import_errors_total", &c.import_errors)
            .counter("bytes_written_total", &c.bytes_written)
            .counter("bytes_read_total", &c.bytes_read)
            .gauge_value("shards_exported", shards)
            .gauge_value("bytes_exported", bytes)
            .gauge_value("views_active", self.views.active() as u64)
            .finish()
    }

    fn health(&self) -> Health {
        match fs::metadata(&self.dir) {
            Ok(m) if m.is_dir() => {
                kit::guard::ok(format!("spool directory `{}`", self.dir.display()))
            }
            Ok(_) => {
                kit::guard::failing(format!("`{}` is no longer a directory", self.dir.display()))
            }
            Err(e) => kit::guard::failing(format!("spool directory `{}`: {e}", self.dir.display())),
        }
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
