//! What the cases share: checks that name the case and the transport,
//! exported test shards with their backing memory, and a seeded generator.

#[allow(clippy::wildcard_imports)]
use super::*;
use std::fmt;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// The case being run and the transport it runs against, for messages.
pub(super) struct Check {
    pub(super) case: &'static str,
    pub(super) info: TransportInfo,
}

impl Check {
    pub(super) fn start(case: &'static str, pair: &Pair) -> Check {
        Check {
            case,
            info: pair.owner.describe(),
        }
    }

    pub(super) fn has(&self, cap: Capabilities) -> bool {
        self.info.capabilities.contains(cap)
    }

    /// True when the transport moves CPU shards; otherwise prints why the
    /// data part of the case is skipped.
    pub(super) fn moves_cpu(&self) -> bool {
        let cpu = self.has(Capabilities::CPU);
        if !cpu {
            eprintln!(
                "conformance case `{}` for transport `{}`: data checks skipped, \
                 the transport does not move cpu shards",
                self.case, self.info.name
            );
        }
        cpu
    }

    #[track_caller]
    pub(super) fn fail(&self, msg: impl Display) -> ! {
        panic!(
            "conformance case `{}` failed for transport `{}`: {msg}",
            self.case, self.info.name
        )
    }

    #[track_caller]
    pub(super) fn ok<T>(&self, r: impl Into<Result<T, AbiError>>, what: impl Display) -> T {
        match r.into() {
            Ok(v) => v,
            Err(e) => self.fail(format_args!("{what} failed: {e}")),
        }
    }

    /// Expects an error of one of `kinds` (any kind but `PANIC` when empty).
    #[track_caller]
    pub(super) fn err<T>(
        &self,
        r: impl Into<Result<T, AbiError>>,
        kinds: &[ErrorKind],
        what: impl Display,
    ) -> AbiError {
        match r.into() {
            Ok(_) => self.fail(format_args!(
                "{what} succeeded; expected {}",
                expected(kinds)
            )),
            Err(e) if e.kind == ErrorKind::PANIC => {
                self.fail(format_args!("{what} panicked inside the plugin: {e}"))
            }
            Err(e) if kinds.is_empty() || kinds.contains(&e.kind) => e,
            Err(e) => self.fail(format_args!(
                "{what} failed with the wrong kind: expected {}, got {e}",
                expected(kinds)
            )),
        }
    }

    #[track_caller]
    pub(super) fn same_bytes(&self, got: &[u8], want: &[u8], what: impl Display) {
        if got.len() != want.len() {
            self.fail(format_args!(
                "{what}: got {} bytes, expected {}",
                got.len(),
                want.len()
            ));
        }
        if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
            self.fail(format_args!(
                "{what}: wrong bytes of a {}-byte shard, first difference at byte {i} \
                 (expected {:#04x}, got {:#04x})",
                want.len(),
                want[i],
                got[i]
            ));
        }
    }

    #[track_caller]
    pub(super) fn import_copy(
        &self,
        consumer: &SharedTransport,
        shard: &Exported,
        what: impl Display,
    ) -> Vec<u8> {
        let mut dst = vec![0x5Au8; shard.expected.len()];
        self.ok(
            consumer.import_into(
                RSlice::from_slice(&shard.desc),
                &shard.meta,
                RSliceMut::from_mut_slice(&mut dst),
            ),
            format_args!(
                "import_into of a {}-byte shard ({what})",
                shard.expected.len()
            ),
        );
        dst
    }

    #[track_caller]
    pub(super) fn view(
        &self,
        consumer: &SharedTransport,
        shard: &Exported,
        what: impl Display,
    ) -> LeasedView {
        self.ok(
            LeasedView::import(consumer, &shard.desc, &shard.meta),
            format_args!(
                "import_view of a {}-byte shard ({what})",
                shard.expected.len()
            ),
        )
    }

    #[track_caller]
    pub(super) fn allocate(
        &self,
        owner: &SharedTransport,
        id: ShardId,
        len: u64,
    ) -> AllocationGuard {
        self.ok(
            AllocationGuard::allocate(owner, id, len),
            format_args!("allocate({id}, {len})"),
        )
    }

    /// Stats as `(name, kind, value)`, checked for names and kinds.
    #[track_caller]
    pub(super) fn stats(&self, t: &SharedTransport, who: &str) -> Vec<(String, StatKind, u64)> {
        let stats = t.stats();
        let mut seen = HashSet::new();
        let mut out = Vec::with_capacity(stats.len());
        for s in stats.iter() {
            let name = s.name.as_str();
            if !is_snake_case(name) {
                self.fail(format_args!(
                    "{who} stat name {name:?} is not snake_case ([a-z][a-z0-9_]*, no `__`, no trailing `_`)"
                ));
            }
            if !seen.insert(name.to_owned()) {
                self.fail(format_args!("{who} reports stat `{name}` twice"));
            }
            if s.kind != StatKind::COUNTER && s.kind != StatKind::GAUGE {
                self.fail(format_args!(
                    "{who} stat `{name}` has unknown kind {}",
                    s.kind.0
                ));
            }
            out.push((name.to_owned(), s.kind, s.value));
        }
        out
    }
}

/// A shard the case exported. Dropping it unexports the shard first (when
/// the case did not), then frees the lent bytes: the lent memory outlives
/// the export even when the case panics half-way.
pub(super) struct Exported {
    pub(super) owner: SharedTransport,
    pub(super) id: ShardId,
    pub(super) meta: ShardMeta,
    pub(super) desc: Vec<u8>,
    /// What an import must return.
    pub(super) expected: Vec<u8>,
    /// The lent bytes, read by the transport until `unexport` returns: only
    /// kept alive here, never read.
    pub(super) _backing: Backing,
    pub(super) live: bool,
}

/// Owner of lent bytes.
pub(super) enum Backing {
    Heap { _bytes: Vec<u8> },
    Pool { _guard: AllocationGuard },
}

impl Exported {
    #[track_caller]
    pub(super) fn unexport(mut self, c: &Check) {
        self.live = false;
        c.ok(
            self.owner.unexport(self.id),
            format_args!("unexport of shard {}", self.id),
        );
    }
}

impl Drop for Exported {
    fn drop(&mut self) {
        if self.live {
            let _ = self.owner.unexport(self.id);
        }
        // `_backing` drops after this body, once the shard is withdrawn.
    }
}

impl Exported {
    /// A shard not exported yet, whose bytes `backing` holds. Built before
    /// the export so that a failing export still drops `backing` in order.
    fn unpublished(
        owner: &SharedTransport,
        id: ShardId,
        expected: Vec<u8>,
        backing: Backing,
    ) -> Exported {
        Exported {
            owner: Arc::clone(owner),
            id,
            meta: meta_for(expected.len()),
            desc: Vec::new(),
            expected,
            _backing: backing,
            live: false,
        }
    }

    /// Exports `lent` (the bytes `_backing` holds) with `allocation`'s
    /// token; `what` names the export in a failure.
    #[track_caller]
    fn publish(
        mut self,
        c: &Check,
        lent: SharedBytes,
        allocation: u64,
        what: fmt::Arguments<'_>,
    ) -> Exported {
        let desc = c.ok(
            self.owner.export(ExportRequest {
                id: self.id,
                meta: self.meta.clone(),
                data: lent,
                allocation,
            }),
            what,
        );
        self.live = true;
        self.desc = desc.into_vec();
        self
    }
}

/// Exports `len` seeded bytes from a heap buffer.
#[track_caller]
pub(super) fn export_heap(
    c: &Check,
    owner: &SharedTransport,
    rng: &mut Rng,
    len: usize,
) -> Exported {
    let id = fresh_id(rng);
    let expected = rng.bytes(len);
    let data = expected.clone();
    let lent = SharedBytes::lend(&data);
    // Moving the Vec keeps its heap buffer, which `lent` points at.
    let backing = Backing::Heap { _bytes: data };
    Exported::unpublished(owner, id, expected, backing).publish(
        c,
        lent,
        0,
        format_args!("export of a {len}-byte shard {id}"),
    )
}

/// Writes `len` seeded bytes into an allocation and exports it in place.
#[track_caller]
pub(super) fn export_pool(
    c: &Check,
    owner: &SharedTransport,
    rng: &mut Rng,
    len: usize,
) -> Exported {
    let id = fresh_id(rng);
    let expected = rng.bytes(len);
    let mut guard = c.allocate(owner, id, len as u64);
    guard.as_mut_slice().copy_from_slice(&expected);
    let allocation = guard.mark_exported();
    let lent = SharedBytes::lend(guard.as_slice());
    let backing = Backing::Pool { _guard: guard };
    Exported::unpublished(owner, id, expected, backing).publish(
        c,
        lent,
        allocation,
        format_args!(
            "export in place of a {len}-byte allocation (token {allocation}) as shard {id}"
        ),
    )
}

/// Metadata for `len` bytes: bf16 for even lengths (two-dimensional when it
/// divides), raw bytes otherwise, so transports see more than `u8`.
pub(super) fn meta_for(len: usize) -> ShardMeta {
    let len64 = len as u64;
    if len > 0 && len % 128 == 0 {
        ShardMeta {
            dtype: DType::BF16,
            shape: vec![len64 / 128, 64].into(),
            device: Device::CPU,
            byte_len: len64,
            checksum: abi_stable::std_types::ROption::RNone,
        }
    } else if len > 0 && len % 2 == 0 {
        ShardMeta {
            dtype: DType::BF16,
            shape: vec![len64 / 2].into(),
            device: Device::CPU,
            byte_len: len64,
            checksum: abi_stable::std_types::ROption::RNone,
        }
    } else {
        ShardMeta::bytes(len64)
    }
}

/// An id unique within the process: random high half, counter low half.
pub(super) fn fresh_id(rng: &mut Rng) -> ShardId {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    ShardId {
        hi: rng.next_u64(),
        lo: NEXT.fetch_add(1, Ordering::Relaxed),
    }
}

pub(super) fn same_info(a: &TransportInfo, b: &TransportInfo) -> bool {
    a.name == b.name
        && a.version == b.version
        && a.capabilities == b.capabilities
        && a.needs_identity == b.needs_identity
}

pub(super) fn is_snake_case(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
        && !name.contains("__")
        && !name.ends_with('_')
}

pub(super) fn expected(kinds: &[ErrorKind]) -> String {
    if kinds.is_empty() {
        return "an error".to_owned();
    }
    let names: Vec<String> = kinds.iter().map(ToString::to_string).collect();
    format!("an error of kind {}", names.join(" or "))
}

/// The first bytes of `b` in hex, for messages.
pub(super) fn hex_preview(b: &[u8]) -> String {
    const SHOWN: usize = 24;
    let mut s: String = b.iter().take(SHOWN).map(|x| format!("{x:02x}")).collect();
    if b.len() > SHOWN {
        s.push_str(&format!("... {} bytes", b.len()));
    }
    if s.is_empty() {
        s.push_str("empty");
    }
    s
}

/// SplitMix64: a tiny seeded generator, so failures reproduce.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(super) fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        for chunk in v.chunks_mut(8) {
            let x = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&x[..chunk.len()]);
        }
        v
    }
}
