//! The cases: each checks one part of the transport contract against a
//! fresh owner/consumer pair.

#[allow(clippy::wildcard_imports)]
use super::*;

// ---------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------

/// `describe` reports a usable name and version, only known capability and
/// identity bits, at least one of `CPU` / `CUDA`, the same answer on both
/// instances and on repeated calls, and a non-empty `needs_identity` for a
/// `SAME_NODE_ONLY` transport.
pub fn describe_is_sane(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("describe_is_sane", &pair);
    let info = &c.info;
    let name = info.name.as_str();
    if name.is_empty() {
        c.fail("describe() returned an empty name");
    }
    let name_ok = name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.as_bytes()[0].is_ascii_lowercase();
    if !name_ok {
        c.fail(format_args!(
            "name {name:?} is not a transport name: lowercase letters, digits and `-`, \
             starting with a letter, at most 64 characters (configs and handles use it)"
        ));
    }
    if info.version.trim().is_empty() {
        c.fail("describe() returned an empty version");
    }
    let caps = info.capabilities;
    if caps.0 & !KNOWN_CAPABILITIES != 0 {
        c.fail(format_args!(
            "capabilities {:#x} set bits this interface does not define ({:#x})",
            caps.0,
            caps.0 & !KNOWN_CAPABILITIES
        ));
    }
    if !caps.contains(Capabilities::CPU) && !caps.contains(Capabilities::CUDA) {
        c.fail(format_args!(
            "capabilities {caps:?} name neither `cpu` nor `cuda`: the transport moves nothing"
        ));
    }
    if info.needs_identity.0 & !KNOWN_IDENTITY != 0 {
        c.fail(format_args!(
            "needs_identity {:#x} sets bits this interface does not define",
            info.needs_identity.0
        ));
    }
    if caps.contains(Capabilities::SAME_NODE_ONLY) && info.needs_identity.0 == 0 {
        c.fail(
            "a same-node-only transport must say which identity parts must agree \
             (needs_identity is empty, so the router would try it on any local address)",
        );
    }
    for (who, other) in [
        ("the owner, called again,", pair.owner.describe()),
        ("the consumer", pair.consumer.describe()),
    ] {
        if !same_info(info, &other) {
            c.fail(format_args!(
                "{who} describes itself differently: {other:?} vs {info:?}"
            ));
        }
    }
}

/// Shards of 0, 1, 63, 4096 and 1 MiB + 3 bytes of a seeded pattern survive
/// `export` on the owner and `import_into` on the consumer, twice each.
pub fn copy_roundtrip(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("copy_roundtrip", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0xC0_97);
    for len in SIZES {
        let shard = export_heap(&c, &pair.owner, &mut rng, len);
        if shard.desc.is_empty() {
            c.fail(format_args!(
                "export of a {len}-byte shard returned an empty descriptor"
            ));
        }
        for attempt in ["first", "second"] {
            let got = c.import_copy(&pair.consumer, &shard, attempt);
            c.same_bytes(&got, &shard.expected, format_args!("{attempt} import_into"));
        }
        shard.unexport(&c);
    }
}

/// With `ZERO_COPY`, `import_view` of every size yields the exported bytes,
/// two views of one shard coexist, and the leases release cleanly; without
/// it, `import_view` of a valid descriptor is `UNSUPPORTED`.
pub fn zero_copy_view(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("zero_copy_view", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0x2E_20);
    if !c.has(Capabilities::ZERO_COPY) {
        let shard = export_heap(&c, &pair.owner, &mut rng, 4096);
        let r = pair
            .consumer
            .import_view(RSlice::from_slice(&shard.desc), &shard.meta);
        c.err(
            r,
            &[ErrorKind::UNSUPPORTED],
            "import_view on a transport without `zero-copy`",
        );
        shard.unexport(&c);
        return;
    }
    for len in SIZES {
        let shard = export_heap(&c, &pair.owner, &mut rng, len);
        let first = c.view(&pair.consumer, &shard, "first import_view");
        let second = c.view(&pair.consumer, &shard, "second import_view");
        c.same_bytes(&first, &shard.expected, "first view");
        c.same_bytes(
            &second,
            &shard.expected,
            "second view, taken while the first is held",
        );
        if len > 0 && first.token() == second.token() {
            c.fail(format_args!(
                "two live views of one shard share lease token {}",
                first.token()
            ));
        }
        drop(first);
        c.same_bytes(
            &second,
            &shard.expected,
            "second view after the first was released",
        );
        drop(second);
        let copy = c.import_copy(&pair.consumer, &shard, "after both views were released");
        c.same_bytes(&copy, &shard.expected, "import_into after views");
        shard.unexport(&c);
    }
}

/// With `ALLOCATOR`: shards written into allocations and exported in place
/// (`allocation: guard.mark_exported()`) round-trip for every size, two live
/// allocations do not overlap, freeing an allocation twice fails, and 1 GiB
/// cycled through allocate-and-drop never exhausts the pool. Without it,
/// `allocate` is `UNSUPPORTED`.
pub fn allocator(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("allocator", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0xA1_10C);
    if !c.has(Capabilities::ALLOCATOR) {
        let r = pair.owner.allocate(fresh_id(&mut rng), 4096);
        if let RResult::ROk(a) = &r {
            // Be tidy even though the case fails.
            let _ = pair.owner.free_allocation(a.token);
        }
        c.err(
            r,
            &[ErrorKind::UNSUPPORTED],
            "allocate on a transport without `allocator`",
        );
        return;
    }
    for len in SIZES {
        let shard = export_pool(&c, &pair.owner, &mut rng, len);
        let got = c.import_copy(&pair.consumer, &shard, "of a shard exported in place");
        c.same_bytes(&got, &shard.expected, "import_into of an allocation export");
        if c.has(Capabilities::ZERO_COPY) {
            let view = c.view(
                &pair.consumer,
                &shard,
                "import_view of an allocation export",
            );
            c.same_bytes(&view, &shard.expected, "view of an allocation export");
        }
        shard.unexport(&c);
    }

    // Two live allocations are disjoint: each keeps its own pattern.
    let len = 64 << 10;
    let mut a = c.allocate(&pair.owner, fresh_id(&mut rng), len);
    let mut b = c.allocate(&pair.owner, fresh_id(&mut rng), len);
    if a.token() == b.token() {
        c.fail(format_args!(
            "two live allocations share token {}",
            a.token()
        ));
    }
    let (pa, pb) = (rng.bytes(len as usize), rng.bytes(len as usize));
    a.as_mut_slice().copy_from_slice(&pa);
    b.as_mut_slice().copy_from_slice(&pb);
    c.same_bytes(
        a.as_slice(),
        &pa,
        "first of two live allocations (they overlap)",
    );
    c.same_bytes(
        b.as_slice(),
        &pb,
        "second of two live allocations (they overlap)",
    );

    // A dropped, never-exported allocation is freed: its token is gone...
    let token = a.token();
    drop(a);
    c.err(
        pair.owner.free_allocation(token),
        ANY_ERROR,
        format_args!("free_allocation of token {token}, already freed when its guard dropped"),
    );
    drop(b);
    // ...and its space comes back: cycling far more than a pool holds works.
    let mut cycled = 0;
    while cycled < ALLOC_CYCLE_BYTES {
        let id = fresh_id(&mut rng);
        match AllocationGuard::allocate(&pair.owner, id, ALLOC_CYCLE_STEP) {
            Ok(guard) => drop(guard),
            Err(e) => c.fail(format_args!(
                "allocate failed after {} of allocate-and-drop in {} steps \
                 (dropped allocations are not returned?): {e}",
                crate::options::format_byte_size(cycled),
                crate::options::format_byte_size(ALLOC_CYCLE_STEP)
            )),
        }
        cycled += ALLOC_CYCLE_STEP;
    }
}

/// After `unexport`, importing the old descriptor fails with `NOT_FOUND` or
/// `UNAVAILABLE`; a second `unexport`, or one of an id never exported, is
/// `NOT_FOUND`.
pub fn unexport_semantics(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("unexport_semantics", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0x0E_C5);
    for len in [1, 4096] {
        let shard = export_heap(&c, &pair.owner, &mut rng, len);
        let (id, desc, meta) = (shard.id, shard.desc.clone(), shard.meta.clone());
        shard.unexport(&c);
        let mut dst = vec![0u8; len];
        c.err(
            pair.consumer.import_into(
                RSlice::from_slice(&desc),
                &meta,
                RSliceMut::from_mut_slice(&mut dst),
            ),
            GONE_KINDS,
            format_args!("import_into of shard {id} after its unexport"),
        );
        if c.has(Capabilities::ZERO_COPY) {
            c.err(
                LeasedView::import(&pair.consumer, &desc, &meta),
                GONE_KINDS,
                format_args!("import_view of shard {id} after its unexport"),
            );
        }
        c.err(
            pair.owner.unexport(id),
            &[ErrorKind::NOT_FOUND],
            format_args!("second unexport of shard {id}"),
        );
    }
    let never = fresh_id(&mut rng);
    c.err(
        pair.owner.unexport(never),
        &[ErrorKind::NOT_FOUND],
        format_args!("unexport of shard {never}, never exported"),
    );
}

/// Empty, seeded random, valid-prefix-plus-random and every truncation of a
/// valid descriptor fail with `INVALID_DESCRIPTOR`, `NOT_FOUND` or
/// `UNAVAILABLE` (a panic caught by the guard is `PANIC`, and fails).
pub fn garbage_descriptors(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("garbage_descriptors", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0x6A_4BA6E);
    let shard = export_heap(&c, &pair.owner, &mut rng, 4096);
    let desc = shard.desc.clone();
    let mut garbage: Vec<(String, Vec<u8>)> = vec![("an empty descriptor".into(), Vec::new())];
    for len in [
        1, 2, 3, 4, 7, 8, 15, 16, 17, 24, 31, 32, 33, 64, 100, 255, 256, 1024, 4096,
    ] {
        for round in 0..4 {
            garbage.push((
                format!("{len} random bytes (round {round})"),
                rng.bytes(len),
            ));
        }
    }
    for keep in 1..desc.len() {
        garbage.push((
            format!(
                "the valid descriptor truncated to {keep} of {} bytes",
                desc.len()
            ),
            desc[..keep].to_vec(),
        ));
        let mut tail = desc[..keep].to_vec();
        tail.extend(rng.bytes(desc.len() - keep));
        if tail != desc {
            garbage.push((
                format!("the first {keep} bytes of the valid descriptor, then random bytes"),
                tail,
            ));
        }
    }
    for (what, bytes) in &garbage {
        let mut dst = vec![0u8; 4096];
        c.err(
            pair.consumer.import_into(
                RSlice::from_slice(bytes),
                &shard.meta,
                RSliceMut::from_mut_slice(&mut dst),
            ),
            BAD_DESCRIPTOR_KINDS,
            format_args!("import_into of {what} ({})", hex_preview(bytes)),
        );
        if c.has(Capabilities::ZERO_COPY) {
            c.err(
                LeasedView::import(&pair.consumer, bytes, &shard.meta),
                BAD_DESCRIPTOR_KINDS,
                format_args!("import_view of {what} ({})", hex_preview(bytes)),
            );
        }
    }
    // The valid descriptor still works after all that.
    let got = c.import_copy(&pair.consumer, &shard, "after the garbage");
    c.same_bytes(
        &got,
        &shard.expected,
        "import_into after garbage descriptors",
    );
    shard.unexport(&c);
}

/// Every single-bit flip of a valid descriptor either fails (any kind but
/// `PANIC`) or imports exactly the exported bytes: never different bytes.
pub fn descriptor_bit_flips(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("descriptor_bit_flips", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0xB1_7F11);
    let shard = export_heap(&c, &pair.owner, &mut rng, 4096);
    // Descriptors are small; bound the work for one that is not.
    let bits = (shard.desc.len() * 8).min(4096);
    for bit in 0..bits {
        let mut flipped = shard.desc.clone();
        flipped[bit / 8] ^= 1 << (bit % 8);
        let what = format!("import_into of the descriptor with bit {bit} flipped");
        let mut dst = vec![0xA5u8; 4096];
        match pair.consumer.import_into(
            RSlice::from_slice(&flipped),
            &shard.meta,
            RSliceMut::from_mut_slice(&mut dst),
        ) {
            RResult::ROk(_) => c.same_bytes(&dst, &shard.expected, &what),
            r @ RResult::RErr(_) => {
                c.err(r, ANY_ERROR, &what);
            }
        }
        if c.has(Capabilities::ZERO_COPY) {
            let what = format!("import_view of the descriptor with bit {bit} flipped");
            match LeasedView::import(&pair.consumer, &flipped, &shard.meta) {
                Ok(view) => c.same_bytes(&view, &shard.expected, &what),
                Err(e) => {
                    c.err::<()>(RResult::RErr(e), ANY_ERROR, &what);
                }
            }
        }
    }
    shard.unexport(&c);
}

/// `import_into` with a destination shorter or longer than `meta.byte_len`
/// is `INVALID_ARGUMENT`; a `meta.byte_len` that disagrees with what was
/// exported (destination sized to match it) fails, for copies and views.
pub fn wrong_destination_length(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("wrong_destination_length", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0x1E_4674);
    let shard = export_heap(&c, &pair.owner, &mut rng, 4096);
    for len in [0, 1, 4095, 4097, 8192] {
        let mut dst = vec![0u8; len];
        c.err(
            pair.consumer.import_into(
                RSlice::from_slice(&shard.desc),
                &shard.meta,
                RSliceMut::from_mut_slice(&mut dst),
            ),
            &[ErrorKind::INVALID_ARGUMENT],
            format_args!(
                "import_into a {len}-byte destination for a shard of {} bytes",
                shard.meta.byte_len
            ),
        );
    }
    for claimed in [0u64, 4095, 4097] {
        let mut meta = shard.meta.clone();
        meta.byte_len = claimed;
        meta.dtype = DType::U8;
        meta.shape = vec![claimed].into();
        let mut dst = vec![0u8; claimed as usize];
        c.err(
            pair.consumer.import_into(
                RSlice::from_slice(&shard.desc),
                &meta,
                RSliceMut::from_mut_slice(&mut dst),
            ),
            ANY_ERROR,
            format_args!("import_into with meta.byte_len {claimed} for a 4096-byte shard"),
        );
        if c.has(Capabilities::ZERO_COPY) {
            let r = pair
                .consumer
                .import_view(RSlice::from_slice(&shard.desc), &meta);
            if let RResult::ROk(region) = &r {
                let _ = pair.consumer.release(region.token);
            }
            c.err(
                r,
                ANY_ERROR,
                format_args!("import_view with meta.byte_len {claimed} for a 4096-byte shard"),
            );
        }
    }
    let got = c.import_copy(&pair.consumer, &shard, "after the wrong lengths");
    c.same_bytes(&got, &shard.expected, "import_into after wrong lengths");
    shard.unexport(&c);
}

/// `release` of a token never handed out (0 and random ones) fails; with
/// `ZERO_COPY`, releasing a real lease twice fails the second time. Without
/// `ALLOCATOR`, `free_allocation` of any token fails too.
pub fn release_errors(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("release_errors", &pair);
    let mut rng = Rng::new(0x4E_1EA5E);
    let mut unknown_release = vec![ErrorKind::INVALID_ARGUMENT, ErrorKind::NOT_FOUND];
    if !c.has(Capabilities::ZERO_COPY) {
        unknown_release.push(ErrorKind::UNSUPPORTED);
    }
    let mut tokens = vec![0, u64::MAX];
    tokens.extend((0..8).map(|_| rng.next_u64()));
    for token in &tokens {
        c.err(
            pair.consumer.release(*token),
            &unknown_release,
            format_args!("release of token {token}, never handed out"),
        );
    }
    let mut unknown_free = vec![ErrorKind::INVALID_ARGUMENT, ErrorKind::NOT_FOUND];
    if !c.has(Capabilities::ALLOCATOR) {
        unknown_free.push(ErrorKind::UNSUPPORTED);
    }
    for token in &tokens {
        c.err(
            pair.owner.free_allocation(*token),
            &unknown_free,
            format_args!("free_allocation of token {token}, never handed out"),
        );
    }
    if c.has(Capabilities::ZERO_COPY) && c.moves_cpu() {
        let shard = export_heap(&c, &pair.owner, &mut rng, 4096);
        let region = c.ok(
            pair.consumer
                .import_view(RSlice::from_slice(&shard.desc), &shard.meta),
            "import_view of a valid descriptor",
        );
        let token = region.token;
        c.ok(pair.consumer.release(token), "first release of a lease");
        c.err(
            pair.consumer.release(token),
            &[ErrorKind::INVALID_ARGUMENT, ErrorKind::NOT_FOUND],
            format_args!("second release of lease token {token}"),
        );
        shard.unexport(&c);
    }
}

/// With `ZERO_COPY`: a view taken before its shard is unexported keeps its
/// bytes while several other shards of the same size are exported (through
/// the allocator when there is one, so a pool would reuse the space) and
/// unexported; the view is then dropped. Without it, `import_view` is
/// `UNSUPPORTED`.
pub fn view_survives_unexport(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("view_survives_unexport", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0x5A_17E);
    if !c.has(Capabilities::ZERO_COPY) {
        let shard = export_heap(&c, &pair.owner, &mut rng, 64);
        c.err(
            pair.consumer
                .import_view(RSlice::from_slice(&shard.desc), &shard.meta),
            &[ErrorKind::UNSUPPORTED],
            "import_view on a transport without `zero-copy`",
        );
        shard.unexport(&c);
        return;
    }
    let pooled = c.has(Capabilities::ALLOCATOR);
    let export = |rng: &mut Rng, len| {
        if pooled {
            export_pool(&c, &pair.owner, rng, len)
        } else {
            export_heap(&c, &pair.owner, rng, len)
        }
    };
    for len in [4096, (1 << 20) + 3] {
        let shard = export(&mut rng, len);
        let view = c.view(&pair.consumer, &shard, "import_view before unexport");
        let expected = shard.expected.clone();
        shard.unexport(&c);
        c.same_bytes(
            &view,
            &expected,
            "a view right after its shard was unexported",
        );
        // Churn: export, import and unexport others, then keep a few live.
        for _ in 0..OVERWRITE_SHARDS {
            let other = export(&mut rng, len);
            let got = c.import_copy(&pair.consumer, &other, "of a shard exported over a view");
            c.same_bytes(
                &got,
                &other.expected,
                "a shard exported while a view is held",
            );
            other.unexport(&c);
        }
        let live: Vec<Exported> = (0..OVERWRITE_SHARDS)
            .map(|_| export(&mut rng, len))
            .collect();
        c.same_bytes(
            &view,
            &expected,
            format_args!(
                "a view of an unexported shard after {} other {len}-byte shards were exported \
                 (its memory was reused while leased)",
                2 * OVERWRITE_SHARDS
            ),
        );
        drop(view);
        for other in live {
            let got = c.import_copy(&pair.consumer, &other, "after the old view was released");
            c.same_bytes(
                &got,
                &other.expected,
                "a live shard after the old view was released",
            );
            other.unexport(&c);
        }
    }
}

/// `stats` names are snake_case and unique with a known kind on both
/// instances, counters never decrease across an export and import, and
/// `health` is ok.
pub fn stats_and_health(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("stats_and_health", &pair);
    let before = [
        c.stats(&pair.owner, "owner"),
        c.stats(&pair.consumer, "consumer"),
    ];
    if c.moves_cpu() {
        let mut rng = Rng::new(0x57_A75);
        let shard = export_heap(&c, &pair.owner, &mut rng, 4096);
        let got = c.import_copy(&pair.consumer, &shard, "between two stats calls");
        c.same_bytes(&got, &shard.expected, "import_into between stats calls");
        shard.unexport(&c);
    }
    let after = [
        c.stats(&pair.owner, "owner"),
        c.stats(&pair.consumer, "consumer"),
    ];
    for ((who, before), after) in ["owner", "consumer"].iter().zip(&before).zip(&after) {
        for (name, kind, old) in before {
            let new = after.iter().find(|(n, _, _)| n == name);
            if let Some((_, k, new)) = new {
                if *kind == StatKind::COUNTER && *k == StatKind::COUNTER && new < old {
                    c.fail(format_args!(
                        "{who} counter `{name}` went down from {old} to {new}"
                    ));
                }
            }
        }
    }
    for (who, t) in [("owner", &pair.owner), ("consumer", &pair.consumer)] {
        let h = t.health();
        if !h.ok {
            c.fail(format_args!(
                "{who} health is not ok: {:?}",
                h.message.as_str()
            ));
        }
    }
}

/// 4 threads export 3 shards each at once; then 4 threads import every
/// shard 8 times in different orders (alternating copies and, with
/// `ZERO_COPY`, views) and check every byte.
pub fn concurrent_imports(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("concurrent_imports", &pair);
    if !c.moves_cpu() {
        return;
    }
    const PER_THREAD: usize = 3;
    const ROUNDS: usize = 8;
    let lens = [1usize, 4096, (256 << 10) + 5];
    let shards: Vec<Exported> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (c, owner) = (&c, &pair.owner);
                s.spawn(move || {
                    let mut rng = Rng::new(0xC0_2C + t as u64);
                    (0..PER_THREAD)
                        .map(|i| export_heap(c, owner, &mut rng, lens[i % lens.len()]))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|p| resume_unwind(p)))
            .collect()
    });
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (c, consumer, shards) = (&c, &pair.consumer, &shards);
                s.spawn(move || {
                    for round in 0..ROUNDS {
                        for k in 0..shards.len() {
                            let shard = &shards[(k + t * 5 + round) % shards.len()];
                            let what = format!("thread {t} round {round} shard {}", shard.id);
                            if c.has(Capabilities::ZERO_COPY) && (k + round) % 2 == 1 {
                                let view = c.view(consumer, shard, &what);
                                c.same_bytes(&view, &shard.expected, &what);
                            } else {
                                let got = c.import_copy(consumer, shard, &what);
                                c.same_bytes(&got, &shard.expected, &what);
                            }
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap_or_else(|p| resume_unwind(p));
        }
    });
    for shard in shards {
        shard.unexport(&c);
    }
}

/// `import_many` of one batch: [`BATCH_SHARDS`] - 1 good shards of three
/// sizes, with a garbage descriptor first, a destination one byte short in
/// the middle and a shard unexported just before the call last. One result
/// per item, in order; every good item has exactly its bytes and every bad
/// one fails with its own kind, without failing the others.
pub fn batch_import(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("batch_import", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0xBA_7C4);
    let lens = [4096usize, 1, 63 << 10];
    let mut shards: Vec<Exported> = (0..BATCH_SHARDS)
        .map(|i| export_heap(&c, &pair.owner, &mut rng, lens[i % lens.len()]))
        .collect();
    let gone = shards.pop().expect("BATCH_SHARDS > 0");
    let (gone_desc, gone_meta) = (gone.desc.clone(), gone.meta.clone());
    let mut gone_dst = vec![0u8; gone.expected.len()];
    gone.unexport(&c);
    let garbage = rng.bytes(40);
    let garbage_meta = meta_for(16);
    let mut garbage_dst = vec![0u8; 16];
    let mut short_dst = vec![0u8; shards[0].expected.len() - 1];
    let mut dsts: Vec<Vec<u8>> = shards
        .iter()
        .map(|s| vec![0x5A; s.expected.len()])
        .collect();
    let half = shards.len() / 2;
    fn item<'a>(desc: &'a [u8], meta: &'a ShardMeta, dst: &'a mut [u8]) -> ImportItem<'a> {
        ImportItem {
            desc: RSlice::from_slice(desc),
            meta,
            dst: RSliceMut::from_mut_slice(dst),
        }
    }
    let mut items = vec![item(&garbage, &garbage_meta, &mut garbage_dst)];
    let mut good = dsts.iter_mut().zip(&shards);
    for (dst, s) in good.by_ref().take(half) {
        items.push(item(&s.desc, &s.meta, dst));
    }
    items.push(item(&shards[0].desc, &shards[0].meta, &mut short_dst));
    for (dst, s) in good {
        items.push(item(&s.desc, &s.meta, dst));
    }
    items.push(item(&gone_desc, &gone_meta, &mut gone_dst));
    let n = items.len();
    let results: Vec<Result<ImportInfo, AbiError>> = pair
        .consumer
        .import_many(RSliceMut::from_mut_slice(&mut items))
        .into_iter()
        .map(RResult::into_result)
        .collect();
    drop(items);
    if results.len() != n {
        c.fail(format_args!(
            "import_many returned {} results for {n} items",
            results.len()
        ));
    }
    c.err(
        results[0].clone(),
        BAD_DESCRIPTOR_KINDS,
        "import_many item 0 (a garbage descriptor)",
    );
    c.err(
        results[half + 1].clone(),
        &[ErrorKind::INVALID_ARGUMENT],
        format_args!(
            "import_many item {} (a destination one byte short)",
            half + 1
        ),
    );
    c.err(
        results[n - 1].clone(),
        GONE_KINDS,
        format_args!("import_many item {} (an unexported shard)", n - 1),
    );
    for (k, (s, dst)) in shards.iter().zip(&dsts).enumerate() {
        let pos = if k < half { 1 + k } else { 2 + k };
        let what = format!(
            "import_many item {pos} (shard {}, {} bytes)",
            s.id,
            dst.len()
        );
        c.ok(results[pos].clone(), &what);
        c.same_bytes(dst, &s.expected, &what);
    }
    for s in shards {
        s.unexport(&c);
    }
}
