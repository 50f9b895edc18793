//! Unit tests of the `spool-dir` transport. The transport-independent
//! behaviour is checked by the conformance suite (`tests/conformance.rs`);
//! these cover what is specific to spool files and config.

use std::{os::unix::fs::PermissionsExt, sync::Arc};

use shardport_abi::{
    plugin::guard_constructor, ErrorKind, LeasedView, RSlice, RSliceMut, SharedBytes, TD_Opaque,
    Transport,
};
use shardport_kit::{testing, Guarded};
use tempfile::TempDir;

use super::*;

fn context(config: &str) -> PluginContext {
    PluginContext::new(testing::context("spool", config))
}

fn config_for(dir: &Path) -> String {
    format!("dir = '{}'", dir.display())
}

/// An instance as the host sees it: the plain transport behind the guard.
fn spool(dir: &Path) -> Guarded<SpoolTransport> {
    Guarded(SpoolTransport::new(context(&config_for(dir))).expect("spool-dir constructor"))
}

fn config_error(config: &str) -> String {
    let e = guard_constructor(testing::context("spool", config), create)
        .into_result()
        .err()
        .expect("the constructor accepted a bad config");
    assert_eq!(e.kind, ErrorKind::CONFIG, "{e}");
    e.message.into_string()
}

fn request(id: u128, bytes: &[u8]) -> ExportRequest {
    ExportRequest {
        id: ShardId::from_u128(id),
        meta: ShardMeta::bytes(bytes.len() as u64),
        data: SharedBytes::lend(bytes),
        allocation: 0,
    }
}

fn import(t: &Guarded<SpoolTransport>, desc: &[u8], len: usize) -> Result<Vec<u8>, AbiError> {
    let mut dst = vec![0u8; len];
    t.import_into(
        RSlice::from_slice(desc),
        &ShardMeta::bytes(len as u64),
        RSliceMut::from_mut_slice(&mut dst),
    )
    .into_result()
    .map(|_| dst)
}

/// A descriptor with any file name, even one `encode` would refuse.
fn raw_descriptor(name: &str, len: u64) -> Vec<u8> {
    let mut d = descriptor::MAGIC.to_vec();
    d.push(descriptor::VERSION);
    d.push(name.len() as u8);
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&len.to_le_bytes());
    d
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn config_errors_name_the_key() {
    assert_eq!(
        config_error(""),
        "`plugin.spool.config.dir` is required, e.g. dir = \"/var/spool/shardport\" (the \
         directory owner and consumers share)"
    );
    assert_eq!(
        config_error("dir = 'spool'"),
        "`plugin.spool.config.dir`: expected an absolute path (owner and consumer processes \
         may run in different directories), found \"spool\""
    );
    assert_eq!(
        config_error("dir = '/tmp'\nfsync = 'yes'"),
        "`plugin.spool.config.fsync`: expected true or false, found \"yes\""
    );
    assert_eq!(
        config_error("dir = '/tmp'\nfsynk = true"),
        "unknown key `plugin.spool.config.fsynk` (known keys: dir, fsync)"
    );
    assert_eq!(
        config_error("dir = 3"),
        "`plugin.spool.config.dir`: expected a string, found integer `3`"
    );
}

#[test]
fn a_file_where_the_directory_should_be_is_a_config_error() {
    let tmp = TempDir::new().unwrap();
    let file = tmp.path().join("file");
    fs::write(&file, b"x").unwrap();
    let msg = config_error(&config_for(&file));
    assert!(
        msg.starts_with("`plugin.spool.config.dir`: cannot create spool directory"),
        "{msg}"
    );
}

#[test]
fn creates_a_private_directory() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().join("a/b");
    let t = spool(&dir);
    assert_eq!(t.0.dir(), dir);
    let mode = fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{mode:o}");
}

#[test]
fn describes_a_same_node_cpu_transport() {
    let tmp = TempDir::new().unwrap();
    let info = spool(tmp.path()).describe();
    assert_eq!(info.name.as_str(), "spool-dir");
    assert_eq!(
        info.capabilities,
        Capabilities::CPU
            .with(Capabilities::SAME_NODE_ONLY)
            .with(Capabilities::ZERO_COPY)
    );
    assert_eq!(info.needs_identity, IdentityParts::BOOT_ID);
}

#[test]
fn export_publishes_a_private_file_and_unexport_deletes_it() {
    let tmp = TempDir::new().unwrap();
    let t = spool(tmp.path());
    let bytes: Vec<u8> = (0..=255).collect();
    let desc = t.export(request(0xabc, &bytes)).unwrap().into_vec();

    let name = format!("{}-{:032x}.shard", t.0.ctx.node_tag(), 0xabc);
    assert_eq!(
        files_in(tmp.path()),
        std::slice::from_ref(&name),
        "no temporary file is left"
    );
    let path = tmp.path().join(&name);
    assert_eq!(fs::read(&path).unwrap(), bytes);
    let mode = fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    assert_eq!(desc.len(), 14 + name.len(), "descriptor is compact");
    assert_eq!(
        Descriptor::decode(&desc).unwrap(),
        Descriptor {
            file_name: name,
            byte_len: 256
        }
    );

    t.unexport(ShardId::from_u128(0xabc)).unwrap();
    assert!(files_in(tmp.path()).is_empty());
    let e = import(&t, &desc, 256).unwrap_err();
    assert_eq!(e.kind, ErrorKind::NOT_FOUND, "{e}");
    assert!(
        e.message.contains("unexported, or its owner is gone"),
        "{e}"
    );
}

#[test]
fn a_consumer_reads_from_its_own_directory() {
    let tmp = TempDir::new().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let owner = spool(&a);
    let same_dir = spool(&a);
    let other_dir = spool(&b);
    let desc = owner.export(request(1, b"hello")).unwrap().into_vec();
    assert_eq!(import(&same_dir, &desc, 5).unwrap(), b"hello");
    let e = import(&other_dir, &desc, 5).unwrap_err();
    assert_eq!(e.kind, ErrorKind::NOT_FOUND, "{e}");
}

#[test]
fn drop_deletes_the_files_it_still_owns_and_only_those() {
    let tmp = TempDir::new().unwrap();
    let a = spool(tmp.path());
    let b = spool(tmp.path());
    a.export(request(1, b"one")).unwrap();
    a.export(request(2, b"two")).unwrap();
    b.export(request(1, b"uno")).unwrap();
    assert_eq!(files_in(tmp.path()).len(), 3);
    drop(a);
    let left = files_in(tmp.path());
    assert_eq!(left.len(), 1);
    assert!(left[0].starts_with(b.0.ctx.node_tag()), "{left:?}");
    drop(b);
    assert!(files_in(tmp.path()).is_empty());
}

#[test]
fn consumer_refuses_files_outside_its_rules() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().join("spool");
    let t = spool(&dir);
    fs::write(tmp.path().join("outside.shard"), b"secret").unwrap();
    fs::write(dir.join("short.shard"), b"0123456789").unwrap();
    fs::write(dir.join("partial.shard.tmp"), b"012").unwrap();
    std::os::unix::fs::symlink(tmp.path().join("outside.shard"), dir.join("link.shard")).unwrap();

    let cases = [
        (
            "../outside.shard",
            6,
            ErrorKind::INVALID_DESCRIPTOR,
            "contains '/'",
        ),
        (
            "partial.shard.tmp",
            3,
            ErrorKind::INVALID_DESCRIPTOR,
            "is not a `<name>.shard` file",
        ),
        (
            "link.shard",
            6,
            ErrorKind::INVALID_DESCRIPTOR,
            "is not a regular file",
        ),
        (
            "short.shard",
            11,
            ErrorKind::INVALID_DESCRIPTOR,
            "holds 10 bytes, the descriptor says 11",
        ),
        (
            "missing.shard",
            1,
            ErrorKind::NOT_FOUND,
            "is not in the spool directory",
        ),
    ];
    for (name, len, kind, needle) in cases {
        let e = import(&t, &raw_descriptor(name, len), len as usize).unwrap_err();
        assert_eq!(e.kind, kind, "{name}: {e}");
        assert!(e.message.contains(needle), "{name}: {e}");
    }
    assert_eq!(
        import(&t, &raw_descriptor("short.shard", 10), 10).unwrap(),
        b"0123456789"
    );
}

#[test]
fn fsync_mode_roundtrips() {
    let tmp = TempDir::new().unwrap();
    let config = format!("{}\nfsync = true", config_for(tmp.path()));
    let t = Guarded(SpoolTransport::new(context(&config)).unwrap());
    let desc = t.export(request(7, b"durable")).unwrap().into_vec();
    assert_eq!(import(&t, &desc, 7).unwrap(), b"durable");
    t.unexport(ShardId::from_u128(7)).unwrap();
}

#[test]
fn bad_export_requests_are_invalid_arguments() {
    let tmp = TempDir::new().unwrap();
    let t = spool(tmp.path());
    t.export(request(1, b"abc")).unwrap();
    let mut cuda = request(2, b"abc");
    cuda.meta.device = Device::cuda(0);
    let mut allocation = request(3, b"abc");
    allocation.allocation = 9;
    let mut length = request(4, b"abc");
    length.meta.byte_len = 4;
    for (req, needle) in [
        (request(1, b"abc"), "is already exported"),
        (cuda, "lives on cuda:0: spool-dir moves cpu shards only"),
        (allocation, "allocation token 9 is not ours"),
        (length, "meta.byte_len is 4 but 3 bytes were lent"),
    ] {
        let e = t.export(req).into_result().unwrap_err();
        assert_eq!(e.kind, ErrorKind::INVALID_ARGUMENT, "{e}");
        assert!(e.message.contains(needle), "{e}");
    }
    assert_eq!(
        files_in(tmp.path()).len(),
        1,
        "failed exports leave no files"
    );
}

#[test]
fn the_allocator_is_unsupported() {
    let tmp = TempDir::new().unwrap();
    let t = spool(tmp.path());
    let kinds = [
        t.allocate(ShardId::from_u128(2), 16)
            .into_result()
            .map(|_| ()),
        t.free_allocation(1).into_result(),
    ];
    for r in kinds {
        assert_eq!(r.unwrap_err().kind, ErrorKind::UNSUPPORTED);
    }
}

#[test]
fn views_map_the_file_and_outlive_unexport() {
    let tmp = TempDir::new().unwrap();
    let t = Arc::new(TransportBox::from_value(spool(tmp.path()), TD_Opaque));
    let desc = t.export(request(1, b"zero-copy")).unwrap().into_vec();
    let view = LeasedView::import(&t, &desc, &ShardMeta::bytes(9)).unwrap();
    t.unexport(ShardId::from_u128(1)).unwrap();
    assert!(files_in(tmp.path()).is_empty(), "the file is unlinked");
    assert_eq!(&*view, b"zero-copy", "the lease keeps the mapping");
    let views = |t: &TransportBox| {
        t.stats()
            .iter()
            .find(|s| s.name.as_str() == "views_active")
            .map(|s| s.value)
    };
    assert_eq!(views(&t), Some(1));
    let token = view.token();
    drop(view);
    assert_eq!(views(&t), Some(0));
    let e = t.release(token).into_result().unwrap_err();
    assert_eq!(e.kind, ErrorKind::INVALID_ARGUMENT);
    // The consumer checks a view's file as it checks a copy's.
    let e =
        LeasedView::import(&t, &raw_descriptor("../x.shard", 1), &ShardMeta::bytes(1)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR);
}

#[test]
fn stats_count_the_work() {
    let tmp = TempDir::new().unwrap();
    let t = spool(tmp.path());
    let desc = t.export(request(1, b"abcd")).unwrap().into_vec();
    import(&t, &desc, 4).unwrap();
    import(&t, b"junk", 4).unwrap_err();
    let stats: HashMap<String, u64> = t
        .stats()
        .iter()
        .map(|s| (s.name.to_string(), s.value))
        .collect();
    for (name, value) in [
        ("exports_total", 1),
        ("imports_total", 1),
        ("import_errors_total", 1),
        ("bytes_written_total", 4),
        ("bytes_read_total", 4),
        ("shards_exported", 1),
        ("bytes_exported", 4),
        ("unexports_total", 0),
    ] {
        assert_eq!(stats.get(name), Some(&value), "{name}");
    }
    assert!(t.health().ok);
}

#[test]
fn health_reports_a_vanished_directory() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().join("spool");
    let t = spool(&dir);
    fs::remove_dir(&dir).unwrap();
    let h = t.health();
    assert!(!h.ok);
    assert!(
        h.message.contains("No such file or directory"),
        "{}",
        h.message
    );
}

#[test]
fn logs_reach_the_host() {
    let tmp = TempDir::new().unwrap();
    let capture = testing::CaptureServices::default();
    let ctx = testing::context_with("spool", &config_for(tmp.path()), capture.clone());
    let t = Guarded(SpoolTransport::new(PluginContext::new(ctx)).unwrap());
    t.export(request(0x11, b"x")).unwrap();
    let records = capture.records();
    let exported = records
        .iter()
        .find(|(_, _, m, _)| m == "exported")
        .expect("an `exported` record");
    assert_eq!(exported.0, LogLevel::DEBUG);
    assert_eq!(exported.1, "spool_dir");
    assert!(
        exported
            .3
            .starts_with(&format!("shard={:032x} file=", 0x11)),
        "{}",
        exported.3
    );
}
