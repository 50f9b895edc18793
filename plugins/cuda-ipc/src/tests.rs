//! In-process tests of the transport. Those that need a GPU are gated: they
//! print why they skip and return when no driver is present.

use shardport_abi::{
    plugin::guard_constructor, Capabilities, Device, ErrorKind, ExportRequest, IdentityParts,
    RSlice, RSliceMut, ShardId, ShardMeta, SharedBytes, TransportBox,
};
use shardport_kit::testing;

use crate::descriptor::{Descriptor, BOARD_PREFIX};

fn unavailable(reason: &'static str) -> TransportBox {
    guard_constructor(testing::context("cuda-ipc", ""), move |ctx| {
        crate::create_with(ctx, move || Err(reason.to_owned()))
    })
    .into_result()
    .expect("constructor")
}

fn cuda_meta(len: u64) -> ShardMeta {
    ShardMeta {
        device: Device::cuda(0),
        ..ShardMeta::bytes(len)
    }
}

fn valid_descriptor(len: u64) -> Vec<u8> {
    Descriptor {
        boot_id: [1; 16],
        pid: 1,
        epoch: 1,
        generation: 1,
        device_uuid: [2; 16],
        mem_handle: [3; 64],
        alloc_size: len.max(1),
        offset: 0,
        size: len,
        event_handle: [4; 64],
        slot: 0,
        slot_generation: 1,
        board: format!("{BOARD_PREFIX}test"),
        chunks: Vec::new(),
    }
    .encode()
}

#[test]
fn without_a_driver_it_constructs_describes_and_says_why() {
    let t = unavailable("no CUDA driver: test");
    let info = t.describe();
    assert_eq!(info.name.as_str(), "cuda-ipc");
    assert!(info.capabilities.contains(Capabilities::CUDA));
    assert!(info.capabilities.contains(Capabilities::ZERO_COPY));
    assert!(!info.capabilities.contains(Capabilities::CPU));
    assert!(!info.capabilities.contains(Capabilities::ALLOCATOR));
    assert!(info
        .needs_identity
        .contains(IdentityParts::BOOT_ID.with(IdentityParts::GPU_UUID)));
    let h = t.health();
    assert!(!h.ok);
    assert!(h.message.contains("no CUDA driver: test"), "{}", h.message);
}

#[test]
fn without_a_driver_every_data_method_is_unavailable_naming_the_reason() {
    let t = unavailable("no CUDA driver: test");
    let data = [0u8; 16];
    let expect = |r: Result<(), shardport_abi::AbiError>, op: &str| {
        let e = r.expect_err(op);
        assert_eq!(e.kind, ErrorKind::UNAVAILABLE, "{op}: {e:?}");
        assert!(
            e.message
                .contains("cuda-ipc unavailable: no CUDA driver: test"),
            "{op}: {e}"
        );
    };
    let req = ExportRequest {
        id: ShardId::from_u128(1),
        meta: cuda_meta(16),
        data: SharedBytes::device(0x1000, 16),
        allocation: 0,
    };
    expect(t.export(req).into_result().map(|_| ()), "export");
    expect(t.unexport(ShardId::from_u128(1)).into_result(), "unexport");
    let desc = valid_descriptor(16);
    let mut dst = [0u8; 16];
    expect(
        t.import_into(
            RSlice::from_slice(&desc),
            &cuda_meta(16),
            RSliceMut::from_mut_slice(&mut dst),
        )
        .into_result()
        .map(|_| ()),
        "import_into",
    );
    expect(
        t.import_view(RSlice::from_slice(&desc), &cuda_meta(16))
            .into_result()
            .map(|_| ()),
        "import_view",
    );
    expect(
        t.import_into_device(RSlice::from_slice(&desc), &cuda_meta(16), 0x2000, 16)
            .into_result()
            .map(|_| ()),
        "import_into_device",
    );
    expect(t.release(1).into_result(), "release");
    expect(t.sweep().into_result().map(|_| ()), "sweep");
    assert_eq!(
        t.allocate(ShardId::from_u128(1), 16)
            .into_result()
            .unwrap_err()
            .kind,
        ErrorKind::UNSUPPORTED
    );
    let _ = data;
    let stats = t.stats();
    let avail = stats
        .iter()
        .find(|s| s.name.as_str() == "available")
        .unwrap();
    assert_eq!(avail.value, 0);
}

#[test]
fn can_import_refuses_garbage_and_defers_a_missing_driver_to_the_import() {
    let t = unavailable("no CUDA driver: test");
    let e = t
        .can_import(RSlice::from_slice(b"garbage"), &cuda_meta(7))
        .into_result()
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR);
    // A well-formed descriptor is a candidate: the import then fails with
    // the reason, so the fetch reports a downgrade instead of hiding it.
    t.can_import(RSlice::from_slice(&valid_descriptor(16)), &cuda_meta(16))
        .into_result()
        .unwrap();
}

/// A transport whose probe "found" one GPU with UUID `[2; 16]` (no driver
/// call is made by the paths these tests take: descriptor checks only).
fn with_fake_gpu() -> TransportBox {
    guard_constructor(testing::context("cuda-ipc", ""), |ctx| {
        crate::create_with(ctx, || {
            Ok(crate::Live {
                driver: crate::sys::Driver(shardport_cuda::Driver {
                    version: 12080,
                    devices: 1,
                }),
                uuids: vec![(0, [2; 16])],
            })
        })
    })
    .into_result()
    .expect("constructor")
}

fn descriptor_from(pid: u32) -> Vec<u8> {
    let mut d = Descriptor::decode(&valid_descriptor(16)).unwrap();
    d.boot_id = shardport_kit::lease::liveness::boot_id()
        .unwrap()
        .to_be_bytes();
    d.pid = pid;
    d.encode()
}

#[test]
fn a_descriptor_this_process_exported_is_not_a_candidate() {
    let t = with_fake_gpu();
    let e = t
        .can_import(
            RSlice::from_slice(&descriptor_from(std::process::id())),
            &cuda_meta(16),
        )
        .into_result()
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::UNAVAILABLE, "{e:?}");
    assert!(
        e.message.contains("exported by this process")
            && e.message.contains("cannot open a process's own IPC handle"),
        "{e}"
    );
    // The same descriptor from another process of this boot is a candidate.
    t.can_import(
        RSlice::from_slice(&descriptor_from(std::process::id().wrapping_add(1).max(1))),
        &cuda_meta(16),
    )
    .into_result()
    .expect("another process on the same GPU");
    // A GPU not visible here is refused first, naming the UUID.
    let mut d = Descriptor::decode(&descriptor_from(std::process::id())).unwrap();
    d.device_uuid = [9; 16];
    let e = t
        .can_import(RSlice::from_slice(&d.encode()), &cuda_meta(16))
        .into_result()
        .unwrap_err();
    assert!(e.message.contains("is not visible to this process"), "{e}");
}

#[test]
fn bad_config_is_refused_naming_the_key() {
    let e = guard_constructor(testing::context("gpu", "cache = 3"), crate::create)
        .into_result()
        .err()
        .expect("config error");
    assert_eq!(e.kind, ErrorKind::CONFIG);
    assert!(e.message.contains("plugin.gpu.config.cache"), "{e}");
}

#[test]
fn real_constructor_never_fails_for_lack_of_a_driver() {
    let t = guard_constructor(testing::context("cuda-ipc", ""), crate::create)
        .into_result()
        .expect("constructs with or without CUDA");
    let h = t.health();
    match crate::testkit::unavailable_reason() {
        Some(why) => {
            assert!(!h.ok);
            assert!(h.message.contains(&why), "{} vs {why}", h.message);
        }
        None => assert!(h.ok, "{}", h.message),
    }
}

// ---- GPU-gated ----

fn gpu_or_skip(test: &str) -> bool {
    match crate::testkit::unavailable_reason() {
        Some(why) => {
            eprintln!("skipped {test}: {why}");
            false
        }
        None => true,
    }
}

#[test]
fn gpu_export_sends_the_base_handle_plus_offset() {
    if !gpu_or_skip("gpu_export_sends_the_base_handle_plus_offset") {
        return;
    }
    let t = guard_constructor(testing::context("cuda-ipc", ""), crate::create)
        .into_result()
        .unwrap();
    let buf = crate::testkit::DeviceScratch::new(0, 1 << 20).unwrap();
    buf.fill(7).unwrap();
    let req = ExportRequest {
        id: ShardId::from_u128(1),
        meta: cuda_meta(1000),
        data: SharedBytes::device(buf.addr() + 4096, 1000),
        allocation: 0,
    };
    let desc = t.export(req).into_result().expect("export");
    let d = Descriptor::decode(&desc).unwrap();
    assert_eq!(d.offset, 4096);
    assert_eq!(d.size, 1000);
    assert!(d.alloc_size >= 1 << 20);
    // CUDA cannot open a process's own IPC handle: refused before any
    // driver call, naming why.
    let e = t
        .can_import(RSlice::from_slice(&desc), &cuda_meta(1000))
        .into_result()
        .unwrap_err();
    assert!(e.message.contains("exported by this process"), "{e}");
    t.unexport(ShardId::from_u128(1)).into_result().unwrap();
    assert_eq!(
        t.unexport(ShardId::from_u128(1))
            .into_result()
            .unwrap_err()
            .kind,
        ErrorKind::NOT_FOUND
    );
}

#[test]
fn gpu_host_bytes_of_a_cuda_shard_are_staged() {
    if !gpu_or_skip("gpu_host_bytes_of_a_cuda_shard_are_staged") {
        return;
    }
    let t = guard_constructor(testing::context("cuda-ipc", ""), crate::create)
        .into_result()
        .unwrap();
    let bytes: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
    let req = ExportRequest {
        id: ShardId::from_u128(2),
        meta: cuda_meta(4096),
        data: SharedBytes::lend(&bytes),
        allocation: 0,
    };
    t.export(req).into_result().expect("staged export");
    let staged = t
        .stats()
        .iter()
        .find(|s| s.name.as_str() == "staged_bytes")
        .unwrap()
        .value;
    assert_eq!(staged, 4096);
    t.unexport(ShardId::from_u128(2)).into_result().unwrap();
}

#[test]
fn gpu_cpu_shards_are_refused() {
    if !gpu_or_skip("gpu_cpu_shards_are_refused") {
        return;
    }
    let t = guard_constructor(testing::context("cuda-ipc", ""), crate::create)
        .into_result()
        .unwrap();
    let bytes = [0u8; 8];
    let req = ExportRequest {
        id: ShardId::from_u128(3),
        meta: ShardMeta::bytes(8),
        data: SharedBytes::lend(&bytes),
        allocation: 0,
    };
    assert_eq!(
        t.export(req).into_result().unwrap_err().kind,
        ErrorKind::UNSUPPORTED
    );
}

/// A board of this process played as a peer owner's, named for `test`.
fn peer_board(test: &str) -> (crate::board::Board<crate::sys::BoardMap>, String) {
    let name = format!("{BOARD_PREFIX}test-{}-{test}", std::process::id());
    let layout = crate::board::Layout {
        slots: 2,
        records: 2,
    };
    let map = crate::sys::BoardMap::create(&name, layout.words()).unwrap();
    (crate::board::Board::init(map, layout), name)
}

fn import_error(
    t: &TransportBox,
    board: &str,
    slot: u32,
    slot_generation: u64,
) -> shardport_abi::AbiError {
    let mut d = Descriptor::decode(&descriptor_from(std::process::id() + 1)).unwrap();
    d.board = board.to_owned();
    d.slot = slot;
    d.slot_generation = slot_generation;
    let mut dst = [0u8; 16];
    t.import_into(
        RSlice::from_slice(&d.encode()),
        &cuda_meta(16),
        RSliceMut::from_mut_slice(&mut dst),
    )
    .into_result()
    .unwrap_err()
}

#[test]
fn a_consumer_refuses_boards_of_another_layout_version_and_unexported_slots() {
    // Every refusal here comes before any driver call (the fake GPU has none).
    let t = with_fake_gpu();
    let (board, name) = peer_board("version");
    let generation = board.publish(0).unwrap();
    assert!(board.retire(0, generation));
    let e = import_error(&t, &name, 0, generation);
    assert_eq!(e.kind, ErrorKind::NOT_FOUND, "{e}");
    assert!(e.message.contains("unexported by its owner"), "{e}");
    let e = import_error(&t, &name, 7, generation);
    assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR, "{e}");
    assert!(e.message.contains("`lease slot`: 7"), "{e}");
    assert!(board.scan().is_empty(), "no record left taken");

    // A version-1 owner's board (its magic names its version).
    let (v1, v1_name) = peer_board("v1");
    drop(v1);
    let map = crate::sys::BoardMap::create(&v1_name, 8).unwrap();
    map.as_ref()[0].store(
        u64::from_le_bytes(*b"SPCUBRD1"),
        std::sync::atomic::Ordering::SeqCst,
    );
    let e = import_error(&t, &v1_name, 0, 1);
    assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR, "{e}");
    assert!(
        e.message
            .contains("layout version is 1, this plugin uses version 3"),
        "{e}"
    );
}
