//! The owner's side of relaying: one tree per shard that consumers joined,
//! and the piece hashes of that shard.
//!
//! Members are the fetches that joined; the owner is the root. A joiner is
//! attached under the shallowest live member that serves and has fewer
//! than `fanout` children (ties: the earliest joined), never under itself
//! or its own descendants (a rejoining relay keeps its subtree, and a
//! cycle would starve it). A member reported failed by a child is marked
//! dead and frees its slot at its parent; it comes back to life when it
//! rejoins itself (a relay whose own parent stalled is alive, only late).
//!
//! **Demotion** (placement after a stall): a member reported by a child
//! that it was given as parent or alternate, failed or late (its
//! alternates took over from it), is *demoted*: detached from its slot (the
//! reporter, rejoining, may take it), never again an alternate, a parent
//! only when no other holder has a free slot (rather than the owner beyond
//! its fanout), and told (by the server, a `POST` to its copy) to rejoin;
//! at that rejoin it is placed at the **tail**: under the deepest member
//! with a free slot outside its own subtree, where it keeps fetching
//! without being in anyone's path. It stays demoted for the tree's life (a
//! relay that stalled once may again; the owner cannot see it recover). Its children that did
//! not report it stay under it until they rejoin (so it is never placed
//! below them). A report about a member the reporter was not given changes
//! nothing and is counted as ignored.
//! When no live member has a free slot the owner takes the joiner beyond
//! its fanout: a tree never refuses anyone.
//!
//! A joiner that fetches from several sources (`relay-sources` > 1) is also
//! named **alternates**: its nearest ancestors above its parent (the owner
//! included) that are live and help fewer than `fanout` members, at most
//! `sources - 1` of them. It takes pieces from them only when its parent
//! falls behind. A member's alternates are given back when it rejoins, so
//! no source ever feeds more than `fanout` children and helps more than
//! `fanout` others.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use shardport_abi::ShardId;

use super::wire::{JoinRequest, Parent, Serves};

/// Members one tree records at most; later joiners fetch from the owner
/// without being recorded (bounds the owner's memory per shard).
pub(crate) const MAX_MEMBERS: usize = 4096;

/// Holders one client may demote: enough for a fetch whose parents stall
/// again and again (it rejoins at most 16 times), few enough that a client
/// rejoining to report every parent it is given cannot push a tree's
/// relays out one by one. A client is the address its joins come from
/// (whatever member ids it picks), or its member id when that is unknown.
const MAX_DEMOTIONS_BY_CLIENT: u8 = 4;

/// Members one client address may have recorded in a tree: more than the
/// consumer processes of one machine, far fewer than [`MAX_MEMBERS`], so a
/// flood of joins from one address cannot fill a tree.
pub(crate) const MAX_MEMBERS_BY_CLIENT: usize = 64;

/// One joined fetch.
#[derive(Debug, Clone)]
struct Member {
    serves: Option<Serves>,
    /// Index of the parent in `members`; `ROOT` for the owner (and while
    /// detached, when `depth` is 0).
    parent: usize,
    children: u32,
    /// Members that have it as an alternate now.
    helping: u32,
    /// Its own alternates (`ROOT` for the owner).
    helpers: Vec<usize>,
    depth: u32,
    alive: bool,
    /// Reported failed or late by a member it fed: never a parent or an
    /// alternate again; placed at the tail when it rejoins.
    demoted: bool,
    /// Holders its reports demoted (when its address is unknown).
    demotions: u8,
    /// The address its joins came from.
    peer: Option<IpAddr>,
    /// Its last join: after `keep` its copy may be gone.
    joined: Instant,
}

const ROOT: usize = usize::MAX;

/// Where a joiner fetches from, and whether it was recorded (a member the
/// owner does not record is never told of a removal, so it must keep no
/// copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    pub parent: Parent,
    pub recorded: bool,
    /// Other sources it may take pieces from (only when it asked).
    pub alternates: Vec<Parent>,
    /// What the join's report did.
    pub report: Report,
}

/// What a join's report of a failed or late holder did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Report {
    /// The join reported nothing.
    None,
    /// The holder was demoted now: it is to be told to rejoin (at the
    /// tail) where it serves.
    Demoted(Serves),
    /// The holder was the reporter's, and demoted already.
    Already,
    /// The reporter was never given that holder (or is not recorded): the
    /// report changed nothing.
    Ignored,
}

/// The tree of one shard.
#[derive(Debug)]
pub(crate) struct Tree {
    fanout: u32,
    /// `relay-sources`: a member fetches from its parent and at most this
    /// many less one alternates.
    sources: u32,
    root_children: u32,
    root_helping: u32,
    members: Vec<Member>,
    by_id: HashMap<u64, usize>,
    /// The owner serves TLS: plain holders never get children.
    tls: bool,
    /// The owner requires client certificates: holders that do not never
    /// get children (a consumer without a certificate must not be served
    /// the shard by a holder).
    client_auth: bool,
    /// `relay-keep`: how long a member's copy is assumed to last.
    keep: Duration,
    /// Per client address: members recorded, holders its reports demoted.
    clients: HashMap<IpAddr, Client>,
    /// Serving addresses demoted: a member that joins again under a fresh
    /// id from one of them is demoted at once.
    demoted_at: HashSet<String>,
}

/// The owner's TLS, which its holders must match.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TlsPolicy {
    /// It serves HTTPS.
    pub tls: bool,
    /// It requires client certificates (mutual TLS).
    pub client_auth: bool,
}

/// What a tree counts per client address.
#[derive(Debug, Default, Clone, Copy)]
struct Client {
    members: usize,
    demotions: u8,
}

impl Tree {
    pub(crate) fn new(fanout: u32, sources: u32, tls: TlsPolicy, keep: Duration) -> Tree {
        Tree {
            fanout: fanout.max(1),
            sources: sources.max(1),
            client_auth: tls.client_auth,
            root_children: 0,
            root_helping: 0,
            members: Vec::new(),
            by_id: HashMap::new(),
            tls: tls.tls,
            keep,
            clients: HashMap::new(),
            demoted_at: HashSet::new(),
        }
    }

    /// [`join_from`](Self::join_from) a peer whose address is unknown.
    #[cfg(test)]
    pub(crate) fn join(&mut self, req: &JoinRequest) -> Placement {
        self.join_from(req, None)
    }

    /// Records a join that came from `peer` and answers whom the member
    /// fetches from. Bounds and demotions key on `peer`, not on the member
    /// id the client chose.
    pub(crate) fn join_from(&mut self, req: &JoinRequest, peer: Option<IpAddr>) -> Placement {
        let report = match &req.failed {
            Some(failed) => self.reported(failed, req.late, req.member),
            None => Report::None,
        };
        let unrecorded = |report| Placement {
            parent: Parent::Owner,
            recorded: false,
            alternates: Vec::new(),
            report,
        };
        let me = match self.by_id.get(&req.member) {
            Some(&i) => {
                self.detach(i);
                self.members[i].alive = true;
                self.members[i].joined = Instant::now();
                i
            }
            None if self.members.len() >= MAX_MEMBERS => return unrecorded(report),
            None if peer.is_some_and(|p| {
                self.clients.get(&p).map_or(0, |c| c.members) >= MAX_MEMBERS_BY_CLIENT
            }) =>
            {
                return unrecorded(report)
            }
            None => {
                if let Some(p) = peer {
                    self.clients.entry(p).or_default().members += 1;
                }
                // A holder whose TLS is weaker than the owner's (plain under
                // a TLS owner, no client certificates under an owner that
                // requires them) stays a leaf.
                let serves = req.serves.clone().filter(|s| {
                    (s.tls || !self.tls) && (req.serves_client_auth || !self.client_auth)
                });
                // A holder demoted before stays demoted under a new id.
                let demoted = serves
                    .as_ref()
                    .is_some_and(|s| self.demoted_at.contains(&s.addr));
                self.members.push(Member {
                    serves,
                    parent: ROOT,
                    children: 0,
                    helping: 0,
                    helpers: Vec::new(),
                    // Not attached yet.
                    depth: 0,
                    alive: true,
                    demoted,
                    demotions: 0,
                    peer,
                    joined: Instant::now(),
                });
                self.by_id.insert(req.member, self.members.len() - 1);
                self.members.len() - 1
            }
        };
        let parent = if self.members[me].demoted {
            self.choose_tail(me)
        } else {
            self.choose(me)
        };
        self.attach(me, parent);
        let alternates = if req.alternates {
            self.help(me)
        } else {
            Vec::new()
        };
        Placement {
            parent: self.source(parent),
            recorded: true,
            alternates: alternates.into_iter().map(|a| self.source(a)).collect(),
            report,
        }
    }

    fn source(&self, i: usize) -> Parent {
        match i {
            ROOT => Parent::Owner,
            p => Parent::Holder(
                self.members[p]
                    .serves
                    .clone()
                    .expect("only serving members are chosen"),
            ),
        }
    }

    /// Whether member `i` may be sent consumers now.
    fn can_serve(&self, i: usize) -> bool {
        !self.members[i].demoted && self.could_serve(i)
    }

    /// [`can_serve`](Self::can_serve), demoted or not (a demoted member is
    /// a parent only when no other holder has a slot).
    fn could_serve(&self, i: usize) -> bool {
        let m = &self.members[i];
        m.alive && m.serves.is_some() && m.joined.elapsed() <= self.keep && m.depth != 0
    }

    /// Names `me`'s alternates: the nearest ancestors above its parent
    /// (the owner last) that can serve and help fewer than `fanout`
    /// members, at most `sources - 1`; counts them as helping.
    fn help(&mut self, me: usize) -> Vec<usize> {
        let want = (self.sources as usize - 1).min(super::wire::MAX_ALTERNATES);
        let mut out = Vec::new();
        let mut at = self.members[me].parent;
        // The walk up is bounded: a few levels give sources enough.
        for _ in 0..8 {
            if out.len() >= want || at == ROOT {
                break;
            }
            at = self.members[at].parent;
            if at == ROOT {
                if self.root_helping < self.fanout {
                    self.root_helping += 1;
                    out.push(ROOT);
                }
                break;
            }
            if self.can_serve(at) && self.members[at].helping < self.fanout {
                self.members[at].helping += 1;
                out.push(at);
            }
        }
        self.members[me].helpers.clone_from(&out);
        out
    }

    /// Every address a member serves a copy on (where removals go).
    pub(crate) fn holders(&self) -> Vec<Serves> {
        let mut out: Vec<Serves> = self
            .members
            .iter()
            .filter_map(|m| m.serves.clone())
            .collect();
        out.sort_by(|a, b| a.addr.cmp(&b.addr));
        out.dedup();
        out
    }

    /// A member reported `addr` failed (dead until it rejoins) or `late`:
    /// when `addr` is the reporter's own parent or one of its alternates
    /// (a member it was given knows; a report about anyone else changes
    /// nothing), that holder is demoted and detached, freeing its slot; a
    /// client demotes at most [`MAX_DEMOTIONS_BY_CLIENT`] holders (a failed
    /// one is marked dead all the same).
    fn reported(&mut self, addr: &str, late: bool, reporter: u64) -> Report {
        let Some(&r) = self.by_id.get(&reporter) else {
            return Report::Ignored;
        };
        let m = &self.members[r];
        let given = |i: usize| {
            i != ROOT
                && self.members[i]
                    .serves
                    .as_ref()
                    .is_some_and(|s| s.addr == addr)
        };
        let parent = (m.depth != 0).then_some(m.parent);
        let Some(h) = parent
            .into_iter()
            .chain(m.helpers.iter().copied())
            .find(|&i| given(i))
        else {
            return Report::Ignored;
        };
        if !late {
            self.members[h].alive = false;
        }
        if self.members[h].demoted {
            return Report::Already;
        }
        let budget = match self.members[r].peer {
            Some(p) => &mut self.clients.entry(p).or_default().demotions,
            None => &mut self.members[r].demotions,
        };
        if *budget >= MAX_DEMOTIONS_BY_CLIENT {
            return Report::Ignored;
        }
        *budget += 1;
        self.members[h].demoted = true;
        if let Some(s) = &self.members[h].serves {
            self.demoted_at.insert(s.addr.clone());
        }
        self.detach(h);
        Report::Demoted(self.members[h].serves.clone().expect("given: it serves"))
    }

    fn detach(&mut self, i: usize) {
        for h in std::mem::take(&mut self.members[i].helpers) {
            match h {
                ROOT => self.root_helping = self.root_helping.saturating_sub(1),
                h => self.members[h].helping = self.members[h].helping.saturating_sub(1),
            }
        }
        let p = std::mem::replace(&mut self.members[i].parent, ROOT);
        match p {
            ROOT if self.members[i].depth == 0 => {}
            ROOT => self.root_children = self.root_children.saturating_sub(1),
            p => self.members[p].children = self.members[p].children.saturating_sub(1),
        }
        // Detached: not counted at the root either until attached again.
        self.members[i].depth = 0;
    }

    fn attach(&mut self, i: usize, parent: usize) {
        self.members[i].parent = parent;
        self.members[i].depth = match parent {
            ROOT => {
                self.root_children += 1;
                1
            }
            p => {
                self.members[p].children += 1;
                self.members[p].depth + 1
            }
        };
    }

    /// The shallowest live serving member with a free slot that is not
    /// `me` or below it; the owner when it has a free slot at depth 0, or
    /// when nobody else does. Demoted members come last: one is a parent
    /// only when no other holder has a slot (rather than the owner beyond
    /// its fanout).
    fn choose(&self, me: usize) -> usize {
        if self.root_children < self.fanout {
            return ROOT;
        }
        self.shallowest(me, false)
            .or_else(|| self.shallowest(me, true))
            .unwrap_or(ROOT)
    }

    /// The shallowest member with a free slot outside `me`'s subtree that
    /// can serve (`demoted`: or could, demoted).
    fn shallowest(&self, me: usize, demoted: bool) -> Option<usize> {
        let mut best: Option<(u32, usize)> = None;
        for (i, m) in self.members.iter().enumerate() {
            let serves = if demoted {
                m.demoted && self.could_serve(i)
            } else {
                self.can_serve(i)
            };
            if i == me
                || !serves
                || m.children >= self.fanout
                || best.is_some_and(|(d, _)| d <= m.depth)
                || self.is_below(i, me)
            {
                continue;
            }
            best = Some((m.depth, i));
        }
        best.map(|(_, i)| i)
    }

    /// Where a demoted member rejoins: under the deepest member that can
    /// serve, has a free slot and is outside its subtree (ties: the latest
    /// recorded), out of everyone's path; where no member has a slot, as
    /// [`choose`](Self::choose).
    fn choose_tail(&self, me: usize) -> usize {
        let below = self.subtree(me);
        let mut best: Option<(u32, usize)> = None;
        for (i, m) in self.members.iter().enumerate() {
            if below[i]
                || !self.can_serve(i)
                || m.children >= self.fanout
                || best.is_some_and(|(d, _)| d > m.depth)
            {
                continue;
            }
            best = Some((m.depth, i));
        }
        best.map_or_else(|| self.choose(me), |(_, i)| i)
    }

    /// Which members are `root` or below it, in one pass (each path up is
    /// walked once).
    fn subtree(&self, root: usize) -> Vec<bool> {
        // 0: not known yet, 1: below, 2: not below.
        let mut known = vec![0u8; self.members.len()];
        let mut path = Vec::new();
        for start in 0..self.members.len() {
            let mut i = start;
            let verdict = loop {
                if i == root {
                    break 1;
                }
                if i == ROOT {
                    break 2;
                }
                if known[i] != 0 {
                    break known[i];
                }
                if path.len() > self.members.len() {
                    break 1; // a cycle (never built): treat as below
                }
                path.push(i);
                i = self.members[i].parent;
            };
            for j in path.drain(..) {
                known[j] = verdict;
            }
            if root < known.len() {
                known[root] = 1;
            }
        }
        known.into_iter().map(|k| k == 1).collect()
    }

    /// Whether `i` is `ancestor` or in its subtree.
    fn is_below(&self, mut i: usize, ancestor: usize) -> bool {
        for _ in 0..=self.members.len() {
            if i == ancestor {
                return true;
            }
            if i == ROOT {
                return false;
            }
            i = self.members[i].parent;
        }
        true // a cycle (never built): treat as below, never chosen
    }
}

/// One shard's relay state at its owner.
#[derive(Debug)]
pub(crate) struct Tracked {
    /// The piece hashes as a join reply carries them (count, then each),
    /// computed and encoded once, by the first join.
    pub hashes: tokio::sync::OnceCell<bytes::Bytes>,
    pub piece: u64,
    tree: Mutex<Tree>,
}

impl Tracked {
    /// [`Tree::join_from`] on this shard's tree.
    pub(crate) fn join(&self, req: &JoinRequest, peer: Option<IpAddr>) -> Placement {
        self.tree
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .join_from(req, peer)
    }
}

/// Every shard's tree at this owner.
#[derive(Debug)]
pub(crate) struct Trackers {
    map: Mutex<HashMap<ShardId, Arc<Tracked>>>,
    fanout: u32,
    sources: u32,
    piece: u64,
    tls: TlsPolicy,
    keep: Duration,
}

impl Trackers {
    pub(crate) fn new(
        fanout: u32,
        sources: u32,
        piece: u64,
        tls: TlsPolicy,
        keep: Duration,
    ) -> Trackers {
        Trackers {
            map: Mutex::default(),
            fanout,
            sources,
            piece,
            tls,
            keep,
        }
    }

    /// The tree of `id`, made now if it is the first join. The caller holds
    /// a reader of the export, so an `unexport` cannot have forgotten the
    /// tree yet (it forgets after its readers are gone).
    pub(crate) fn tracked(&self, id: ShardId) -> Arc<Tracked> {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(map.entry(id).or_insert_with(|| {
            Arc::new(Tracked {
                hashes: tokio::sync::OnceCell::new(),
                piece: self.piece,
                tree: Mutex::new(Tree::new(self.fanout, self.sources, self.tls, self.keep)),
            })
        }))
    }

    /// Forgets `id`'s tree; returns where its holders serve.
    pub(crate) fn forget(&self, id: ShardId) -> Vec<Serves> {
        let t = self
            .map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        t.map(|t| {
            t.tree
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .holders()
        })
        .unwrap_or_default()
    }

    /// Shards with a tree now.
    pub(crate) fn len(&self) -> usize {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests;
