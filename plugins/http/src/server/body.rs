//! Response bodies: ready chunks (shard bytes read in place, a batch header
//! table, a JSON error), and GPU shards staged through pinned host memory.
//!
//! # GPU shards
//! A [`Part::Device`] holds the export's [`Reader`] (so `unexport` waits
//! for it) until its turn comes in the body; then a blocking task copies the
//! shard device-to-host into pool buffers one piece at a time and hands
//! each over a channel of [`STAGED_AHEAD`] pieces, while the connection
//! writes the earlier ones: the copy of piece `i + 1` overlaps the sending
//! of piece `i`. A buffer returns to the owner's pool when its piece has
//! been written. The reader is dropped once every piece is copied out of
//! device memory. A failed copy ends the body with an error, so hyper
//! aborts the connection and the consumer sees a short body, never wrong
//! bytes; a consumer that goes away stops the copying at the next piece.

use std::{
    collections::VecDeque,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

use super::Activity;
use crate::{
    gpu::PinnedPool,
    stats::{Held, Stats},
    sys::Reader,
};

/// Pieces staged ahead of the one being written.
const STAGED_AHEAD: usize = 2;

/// Marks one request in flight on its connection until dropped. Every
/// chunk of the response body holds a clone, so it lasts until hyper has
/// written (or dropped) the last byte, not just until it took the last chunk.
#[derive(Debug)]
pub(super) struct InFlight {
    activity: Arc<Activity>,
    _gauge: Held,
}

impl InFlight {
    pub(super) fn new(activity: Arc<Activity>, stats: &Arc<Stats>) -> InFlight {
        activity.request_started();
        InFlight {
            activity,
            _gauge: Held::new(stats, |s| &s.responses_in_flight),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.activity.request_finished();
    }
}

/// A body chunk tied to its request's [`InFlight`] marker.
struct TrackedChunk {
    bytes: Bytes,
    _in_flight: Arc<InFlight>,
}

impl AsRef<[u8]> for TrackedChunk {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// One part of a body.
#[derive(Debug)]
pub(super) enum Part {
    /// Bytes in hand.
    Ready(Bytes),
    /// A GPU shard not yet started: its reader, the staging pool, and how
    /// long a piece may wait for a free buffer.
    Device {
        reader: Reader,
        pool: Arc<PinnedPool>,
        wait: Duration,
        /// The first byte sent (a relay stream resumes mid-shard).
        from: usize,
        /// One past the last byte sent (the shard's end but for a range).
        to: usize,
    },
    /// A GPU shard being staged.
    Staging(mpsc::Receiver<Result<Bytes, String>>),
}

/// A response body.
#[derive(Debug, Default)]
pub(crate) struct Frames {
    parts: VecDeque<Part>,
    remaining: u64,
    /// Kept until the body ends (chunks carry clones).
    in_flight: Option<Arc<InFlight>>,
}

impl Frames {
    /// A body of ready chunks.
    pub(super) fn new(chunks: impl IntoIterator<Item = Bytes>) -> Frames {
        Frames::of(chunks.into_iter().map(Part::Ready))
    }

    /// A body of `parts`, in order.
    pub(super) fn of(parts: impl IntoIterator<Item = Part>) -> Frames {
        let parts: VecDeque<Part> = parts
            .into_iter()
            .filter(|p| !matches!(p, Part::Ready(c) if c.is_empty()))
            .filter(|p| !matches!(p, Part::Device { from, to, .. } if to <= from))
            .collect();
        let remaining = parts
            .iter()
            .map(|p| match p {
                Part::Ready(c) => c.len() as u64,
                Part::Device { from, to, .. } => (to - from) as u64,
                Part::Staging(_) => 0,
            })
            .sum();
        Frames {
            parts,
            remaining,
            in_flight: None,
        }
    }

    pub(super) fn len(&self) -> u64 {
        self.remaining
    }

    /// Sets the length of a body whose parts arrive later (a stream of
    /// relay pieces): what `content-length` says.
    pub(super) fn set_len(&mut self, n: u64) {
        self.remaining = n;
    }

    /// Ties every chunk to `in_flight` (no copy: a chunk moves into the new
    /// `Bytes`' owner; staged chunks are tied as they come).
    pub(super) fn track(&mut self, in_flight: InFlight) {
        let in_flight = Arc::new(in_flight);
        for p in self.parts.iter_mut() {
            if let Part::Ready(c) = p {
                *c = tie(std::mem::take(c), &in_flight);
            }
        }
        self.in_flight = Some(in_flight);
    }

    fn tied(&self, c: Bytes) -> Bytes {
        match &self.in_flight {
            Some(f) => tie(c, f),
            None => c,
        }
    }
}

fn tie(bytes: Bytes, in_flight: &Arc<InFlight>) -> Bytes {
    Bytes::from_owner(TrackedChunk {
        bytes,
        _in_flight: Arc::clone(in_flight),
    })
}

/// Starts copying `reader`'s device memory out, piece by piece, bytes
/// `from..to`.
fn stage(
    reader: Reader,
    pool: Arc<PinnedPool>,
    wait: Duration,
    from: usize,
    to: usize,
) -> mpsc::Receiver<Result<Bytes, String>> {
    let (tx, rx) = mpsc::channel(STAGED_AHEAD);
    tokio::task::spawn_blocking(move || {
        let Some((ordinal, addr)) = reader.device() else {
            let _ = tx.blocking_send(Err("not a GPU shard".to_owned()));
            return;
        };
        let len = to.min(reader.len());
        let mut reader = Some(reader);
        let mut at = from;
        while at < len {
            let n = pool.piece().min(len - at);
            let piece = pool
                .take(ordinal, wait)
                .and_then(|mut p| p.fill(ordinal, addr + at as u64, n).map(|()| p));
            at += n;
            if at >= len {
                // Every byte is out of device memory: unexport may proceed,
                // even while the last pieces wait for a slow client.
                reader = None;
            }
            let failed = piece.is_err();
            // A consumer that went away closed the channel: stop copying.
            if tx.blocking_send(piece.map(Bytes::from_owner)).is_err() || failed {
                return;
            }
        }
        drop(reader);
    });
    rx
}

impl Body for Frames {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        loop {
            let Some(front) = this.parts.front_mut() else {
                this.in_flight = None;
                return Poll::Ready(None);
            };
            match front {
                Part::Ready(c) => {
                    let c = std::mem::take(c);
                    this.parts.pop_front();
                    this.remaining -= c.len() as u64;
                    if this.parts.is_empty() {
                        // The chunks carry the marker from here on.
                        this.in_flight = None;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(c))));
                }
                Part::Device { .. } => {
                    let Some(Part::Device {
                        reader,
                        pool,
                        wait,
                        from,
                        to,
                    }) = this.parts.pop_front()
                    else {
                        unreachable!("matched above");
                    };
                    this.parts
                        .push_front(Part::Staging(stage(reader, pool, wait, from, to)));
                }
                Part::Staging(rx) => match rx.poll_recv(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(None) => {
                        this.parts.pop_front();
                    }
                    Poll::Ready(Some(Err(why))) => {
                        this.parts.clear();
                        this.in_flight = None;
                        tracing::warn!(target: "http", error = %why, "a streamed response (a GPU shard's staging, a relay copy) failed; it is cut short");
                        return Poll::Ready(Some(Err(std::io::Error::other(why))));
                    }
                    Poll::Ready(Some(Ok(c))) => {
                        this.remaining = this.remaining.saturating_sub(c.len() as u64);
                        let c = this.tied(c);
                        return Poll::Ready(Some(Ok(Frame::data(c))));
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}
