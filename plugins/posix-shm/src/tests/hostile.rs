//! What a transport instance refuses, driven through the `Transport` trait
//! object as the host drives it: hostile descriptors, bad tokens and
//! arguments, bad config. Each refusal is an error naming what was wrong,
//! never a panic, and leaves nothing in `/dev/shm`.

use super::*;

#[test]
fn hostile_descriptors_are_invalid() {
    let p = Pair::new("pool-size = 4096\non-full = \"spill\"");
    let good = p.owner.put(1, &[5; 100]).unwrap();
    let spilled = p.owner.put(2, &[6; 4096]).unwrap();
    let d = decode(&good);
    let s = decode(&spilled);
    assert_eq!(s.mode, Mode::Segment);
    let base = crate::names::owner_base(&d.segment).to_owned();
    // A board-shaped segment with a garbage header.
    let fake_board = OwnedSegment::create(&format!("{base}b999"), 4096).unwrap();

    let cases: Vec<(&str, Descriptor<'_>, u64)> = vec![
        // A pool descriptor relabelled as a segment: the name is reported
        // (a pool's name, not a shard segment's) before the segment-mode
        // rules on board, offset and slot.
        (
            "segment",
            Descriptor {
                mode: Mode::Segment,
                ..d.clone()
            },
            100,
        ),
        (
            "segment",
            Descriptor {
                segment: "/../../etc/passwd".into(),
                ..d.clone()
            },
            100,
        ),
        (
            "segment",
            Descriptor {
                segment: format!("{base}p0/../p0").into(),
                ..d.clone()
            },
            100,
        ),
        (
            "segment",
            Descriptor {
                segment: "/other-t1-p0".into(),
                ..d.clone()
            },
            100,
        ),
        (
            "segment",
            Descriptor {
                segment: d.segment.trim_start_matches('/').into(),
                ..d.clone()
            },
            100,
        ),
        (
            "board",
            Descriptor {
                board: "/shardport-someoneelse-b1".into(),
                ..d.clone()
            },
            100,
        ),
        (
            "board",
            Descriptor {
                board: format!("{base}b999").into(),
                ..d.clone()
            },
            100,
        ),
        (
            "len",
            Descriptor {
                offset: 4096 - 64,
                ..d.clone()
            },
            100,
        ),
        (
            "offset",
            Descriptor {
                offset: 1 << 40,
                ..d.clone()
            },
            100,
        ),
        (
            "len",
            Descriptor {
                offset: u64::MAX - 10,
                ..d.clone()
            },
            100,
        ),
        (
            "len",
            Descriptor {
                len: u64::MAX,
                ..d.clone()
            },
            u64::MAX,
        ),
        (
            "len",
            Descriptor {
                len: 99,
                ..d.clone()
            },
            99 + 1,
        ),
        (
            "slot",
            Descriptor {
                slot: 1 << 30,
                ..d.clone()
            },
            100,
        ),
        (
            "len",
            Descriptor {
                len: 5000,
                ..s.clone()
            },
            5000,
        ),
        (
            "offset",
            Descriptor {
                offset: 8,
                ..s.clone()
            },
            4096,
        ),
        (
            "board",
            Descriptor {
                board: d.board.clone(),
                ..s.clone()
            },
            4096,
        ),
    ];
    for (field, desc, meta_len) in cases {
        let bytes = desc.encode();
        let meta = ShardMeta::bytes(meta_len);
        let e = p
            .consumer
            .t()
            .import_view(RSlice::from_slice(&bytes), &meta)
            .into_result()
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR, "{desc:?}: {e}");
        assert!(
            e.message.contains(&format!("field `{field}`")),
            "{desc:?}: {}",
            e.message
        );
        if meta_len < 1 << 20 {
            let mut buf = vec![0u8; meta_len as usize];
            let e = p
                .consumer
                .t()
                .import_into(
                    RSlice::from_slice(&bytes),
                    &meta,
                    RSliceMut::from_mut_slice(&mut buf),
                )
                .into_result()
                .unwrap_err();
            assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR, "{desc:?}: {e}");
        }
    }
    // len != meta.byte_len.
    let e = p.consumer.copy(&good, 101).unwrap_err();
    assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR);
    assert!(e.message.contains("field `len`"), "{}", e.message);
    // Every truncation of valid descriptors, and garbage.
    for desc in [&good, &spilled] {
        for n in 0..desc.len() {
            let e = p.consumer.view(&desc[..n], 100).unwrap_err();
            assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR, "truncated to {n}");
        }
    }
    for garbage in [&b""[..], b"SPSM", &[0xff; 64], &[0; 200]] {
        let e = p.consumer.view(garbage, 100).unwrap_err();
        assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR);
    }
    // A consumer with another prefix refuses our names.
    let other = Node::new("segment-prefix = \"other\"");
    let e = other.copy(&good, 100).unwrap_err();
    assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR);
    assert!(e.message.contains("`/other-`"), "{}", e.message);
    // Nothing above took a lease or broke the shard.
    assert_eq!(p.owner.stat("leases_held_on_owner"), 0);
    assert_eq!(p.consumer.copy(&good, 100).unwrap(), [5; 100]);
    drop(fake_board);
    p.owner.unexport(1).unwrap();
    p.owner.unexport(2).unwrap();
}

#[test]
fn bad_tokens_and_arguments() {
    let p = Pair::new(SMALL_POOL);
    let e = p.consumer.t().release(0).into_result().unwrap_err();
    assert_eq!(e.kind, ErrorKind::INVALID_ARGUMENT);
    assert_eq!(
        p.consumer.t().release(77).into_result().unwrap_err().kind,
        ErrorKind::INVALID_ARGUMENT
    );
    assert_eq!(
        p.owner
            .t()
            .free_allocation(77)
            .into_result()
            .unwrap_err()
            .kind,
        ErrorKind::INVALID_ARGUMENT
    );
    assert_eq!(p.owner.unexport(9).unwrap_err().kind, ErrorKind::NOT_FOUND);

    // Export naming an unknown allocation.
    let bytes = [1u8; 8];
    let e = p
        .owner
        .t()
        .export(ExportRequest {
            id: ShardId::from_u128(1),
            meta: ShardMeta::bytes(8),
            data: SharedBytes::lend(&bytes),
            allocation: 12345,
        })
        .into_result()
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::INVALID_ARGUMENT);

    // meta.byte_len disagreeing with the data.
    let e = p
        .owner
        .t()
        .export(ExportRequest {
            id: ShardId::from_u128(1),
            meta: ShardMeta::bytes(9),
            data: SharedBytes::lend(&bytes),
            allocation: 0,
        })
        .into_result()
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::INVALID_ARGUMENT);

    // Export of the same id twice; allocation for an exported id.
    p.owner.put(1, &bytes).unwrap();
    assert_eq!(
        p.owner.put(1, &bytes).unwrap_err().kind,
        ErrorKind::INVALID_ARGUMENT
    );
    assert_eq!(
        p.owner
            .t()
            .allocate(ShardId::from_u128(1), 8)
            .into_result()
            .unwrap_err()
            .kind,
        ErrorKind::INVALID_ARGUMENT
    );

    // An allocation exported under another id, or with other bytes, is refused
    // and stays usable.
    let mut g = AllocationGuard::allocate(p.owner.t(), ShardId::from_u128(2), 8).unwrap();
    g.as_mut_slice().copy_from_slice(&[3; 8]);
    let wrong_id = p.owner.t().export(ExportRequest {
        id: ShardId::from_u128(3),
        meta: ShardMeta::bytes(8),
        data: SharedBytes::lend(g.as_slice()),
        allocation: g.token(),
    });
    assert_eq!(
        wrong_id.into_result().unwrap_err().kind,
        ErrorKind::INVALID_ARGUMENT
    );
    let other_bytes = p.owner.t().export(ExportRequest {
        id: ShardId::from_u128(2),
        meta: ShardMeta::bytes(8),
        data: SharedBytes::lend(&bytes),
        allocation: g.token(),
    });
    assert_eq!(
        other_bytes.into_result().unwrap_err().kind,
        ErrorKind::INVALID_ARGUMENT
    );
    drop(g);
    assert_eq!(p.owner.stat("allocations_pending"), 0);

    // Copy into a destination of the wrong size.
    let d = p.owner.put(4, &bytes).unwrap();
    let mut small = [0u8; 4];
    let e = p
        .consumer
        .t()
        .import_into(
            RSlice::from_slice(&d),
            &ShardMeta::bytes(8),
            RSliceMut::from_mut_slice(&mut small),
        )
        .into_result()
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::INVALID_ARGUMENT);

    // Device shards are not ours.
    let mut meta = ShardMeta::bytes(8);
    meta.device = shardport_abi::Device::cuda(0);
    let e = p
        .owner
        .t()
        .export(ExportRequest {
            id: ShardId::from_u128(5),
            meta,
            data: SharedBytes::lend(&bytes),
            allocation: 0,
        })
        .into_result()
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::INVALID_ARGUMENT);
    p.owner.unexport(1).unwrap();
    p.owner.unexport(4).unwrap();
}

#[test]
fn config_errors_name_the_key() {
    let e = Node::try_new("pool-sise = \"1GiB\"").err().unwrap();
    assert_eq!(e.kind, ErrorKind::CONFIG);
    assert!(
        e.message.contains("`plugin.shm.config.pool-sise`"),
        "{}",
        e.message
    );
    let e = Node::try_new("segment-prefix = \"a/b\"").err().unwrap();
    assert_eq!(e.kind, ErrorKind::CONFIG);
    assert!(e.message.contains("`plugin.shm.config.segment-prefix`"));
    let e = Node::try_new("allocation = \"buddy\"").err().unwrap();
    assert!(e.message.contains("`plugin.shm.config.allocation`"));
}
