//! GPU shards between whole transport instances, with host memory standing
//! in for the device.

use super::consumer::{run_many, Want};
#[allow(clippy::wildcard_imports)]
use super::*;

// ---------------------------------------------------------------------------
// GPU shards, staged through host memory. No GPU exists here: the plugin's
// `test-device-is-host` mode makes a GPU shard's address host memory, so
// the protocol (pieces, pool, ring, batches, unexport) runs for real on
// real sockets while the device copies are plain memory copies.

pub(crate) const STAND_IN: &str =
    "test-device-is-host = true\ndevice-piece = \"64KiB\"\ndevice-buffers = 2";

pub(crate) fn gpu_meta(len: usize) -> ShardMeta {
    let mut m = ShardMeta::bytes(len as u64);
    m.device = Device::cuda(0);
    m
}

pub(crate) fn export_gpu(t: &SharedTransport, id: u128, data: &[u8]) -> Vec<u8> {
    t.export(ExportRequest {
        id: ShardId::from_u128(id),
        meta: gpu_meta(data.len()),
        data: SharedBytes::device(data.as_ptr() as u64, data.len()),
        allocation: 0,
    })
    .into_result()
    .expect("a GPU export with host memory standing in")
    .into_vec()
}

/// Imports a GPU shard into "device" memory (host memory standing in).
pub(crate) fn fetch_device(
    t: &SharedTransport,
    desc: &[u8],
    len: usize,
) -> Result<Vec<u8>, AbiError> {
    let mut dev = vec![0u8; len];
    t.import_into_device(
        RSlice::from_slice(desc),
        &gpu_meta(len),
        dev.as_mut_ptr() as u64,
        len as u64,
    )
    .into_result()
    .map(|info| {
        assert!(
            info.note.as_str().contains("staged into cuda:0"),
            "{}",
            info.note
        );
        dev
    })
}

#[test]
fn gpu_shards_are_staged_piece_by_piece_to_host_and_device_destinations() {
    let owner = node(STAND_IN);
    let consumer = node(STAND_IN);
    // Not a multiple of the piece size; 17 pieces through a pool of 2.
    let data = pattern((16 << 16) + 123, 7);
    let small = pattern(100, 9);
    let desc = export_gpu(&owner.t, 1, &data);
    let desc_small = export_gpu(&owner.t, 2, &small);
    // Into host memory (the ordinary fetch of a remote GPU shard).
    let mut host = vec![0u8; data.len()];
    consumer
        .t
        .import_into(
            RSlice::from_slice(&desc),
            &gpu_meta(data.len()),
            RSliceMut::from_mut_slice(&mut host),
        )
        .into_result()
        .unwrap();
    assert!(host == data, "host copy");
    // Into "device" memory through the consumer's ring.
    let mut dev = fetch_device(&consumer.t, &desc, data.len()).unwrap();
    assert!(dev == data, "device copy");
    // A wrong destination length is refused before any request.
    assert_kind(
        consumer
            .t
            .import_into_device(
                RSlice::from_slice(&desc),
                &gpu_meta(data.len()),
                dev.as_mut_ptr() as u64,
                10,
            )
            .into_result(),
        ErrorKind::INVALID_ARGUMENT,
        "destination is 10 bytes",
    );
    // A batch mixing GPU and CPU shards.
    let cpu = pattern(5000, 3);
    let desc_cpu = export(&owner.t, 3, &cpu).unwrap();
    run_many(
        &consumer.t,
        &[
            (
                desc.clone(),
                gpu_meta(data.len()),
                data.len(),
                Want::Bytes(data.clone()),
            ),
            (
                desc_cpu,
                ShardMeta::bytes(5000),
                5000,
                Want::Bytes(cpu.clone()),
            ),
            (desc_small, gpu_meta(100), 100, Want::Bytes(small.clone())),
        ],
    );
    // The owner made at most its pool's buffers, however many pieces went out.
    assert!(stat(&owner.t, "device_staging_bytes") <= 2 * 65536);
    assert!(stat(&owner.t, "device_staging_bytes") > 0);
    for id in 1..=3 {
        owner
            .t
            .unexport(ShardId::from_u128(id))
            .into_result()
            .unwrap();
    }
    assert_kind(
        fetch(&consumer.t, &desc, data.len()),
        ErrorKind::NOT_FOUND,
        "not exported",
    );
}

#[test]
fn many_consumers_of_one_gpu_shard_share_the_owner_s_bounded_pool() {
    let owner = node(STAND_IN);
    let data = pattern(40 * 65536 + 1, 5);
    let desc = export_gpu(&owner.t, 9, &data);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let consumer = node(STAND_IN);
                for _ in 0..3 {
                    assert!(fetch_device(&consumer.t, &desc, data.len()).unwrap() == data);
                }
            });
        }
    });
    assert!(stat(&owner.t, "device_staging_bytes") <= 2 * 65536);
    owner
        .t
        .unexport(ShardId::from_u128(9))
        .into_result()
        .unwrap();
}

/// A GPU shard is staged piece by piece while a slow client reads: until
/// every piece is out of "device" memory, unexport waits (the memory must
/// not be freed); new requests get 404 at once; the bytes that arrive are
/// the shard's. Host memory stands in for the device.
#[test]
fn unexport_of_a_gpu_shard_waits_for_its_staging() {
    let data = pattern(BIG, 15);
    let owner = node(STAND_IN);
    export_gpu(&owner.t, 21, &data);
    let path = wire::shard_path(ShardId::from_u128(21));
    let mut slow = connect(owner.addr);
    slow.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .unwrap();
    let (r, mut body) = read_head(&mut slow);
    assert_eq!(r.status, 200);
    let (tx, rx) = mpsc::channel();
    let t = Arc::clone(&owner.t);
    let waiter = std::thread::spawn(move || {
        tx.send(t.unexport(ShardId::from_u128(21)).into_result())
            .unwrap();
    });
    // 64 MiB through a pool of two 64 KiB buffers: the stager cannot be
    // done while the client reads nothing.
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    assert_eq!(get(owner.addr, &path, None).status, 404);
    let mut chunk = vec![0u8; 1 << 20];
    while body.len() < BIG {
        let n = slow.read(&mut chunk).unwrap();
        assert!(n > 0);
        body.extend_from_slice(&chunk[..n]);
    }
    assert!(body == data, "staged bytes differ");
    rx.recv_timeout(GENEROUS)
        .expect("unexport returns once staging is done")
        .unwrap();
    waiter.join().unwrap();
    // Every buffer went back to the pool.
    assert!(stat(&owner.t, "device_staging_bytes") <= 2 * 65536);
}

/// A client that goes away in the middle of a GPU shard: the stager stops
/// at the next piece, unexport then returns promptly, and the next client
/// gets the whole shard from the same pool.
#[test]
fn a_consumer_that_goes_away_stops_the_staging() {
    let data = pattern(BIG, 16);
    // A stager that kept going would hold unexport past this and fail it.
    let owner = node(&format!("{STAND_IN}\nrequest-timeout = \"10s\""));
    let desc = export_gpu(&owner.t, 22, &data);
    let path = wire::shard_path(ShardId::from_u128(22));
    let mut gone = connect(owner.addr);
    gone.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .unwrap();
    let (r, _) = read_head(&mut gone);
    assert_eq!(r.status, 200);
    drop(gone);
    let consumer = node(STAND_IN);
    assert!(fetch_device(&consumer.t, &desc, data.len()).unwrap() == data);
    owner
        .t
        .unexport(ShardId::from_u128(22))
        .into_result()
        .expect("the stager of the client that left has stopped");
    assert_eq!(stat(&owner.t, "unexport_timeouts"), 0);
}
