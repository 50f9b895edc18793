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
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use shardport_abi::ShardId;

use super::wire::{JoinRequest, Parent, Serves};

/// Members one tree records at most; later joiners fetch from the owner
/// without being recorded (bounds the owner's memory per shard).
pub(crate) const MAX_MEMBERS: usize = 4096;

/// Holders one member may demote: enough for a fetch whose parents stall
/// again and again (it rejoins at most 16 times), few enough that a client
/// rejoining to report every parent it is given cannot push a tree's
/// relays out one by one.
const MAX_DEMOTIONS_BY_MEMBER: u8 = 4;

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
    /// Holders its reports demoted.
    demotions: u8,
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
    /// `relay-keep`: how long a member's copy is assumed to last.
    keep: Duration,
}

impl Tree {
    pub(crate) fn new(fanout: u32, sources: u32, tls: bool, keep: Duration) -> Tree {
        Tree {
            fanout: fanout.max(1),
            sources: sources.max(1),
            root_children: 0,
            root_helping: 0,
            members: Vec::new(),
            by_id: HashMap::new(),
            tls,
            keep,
        }
    }

    /// Records a join and answers whom the member fetches from.
    pub(crate) fn join(&mut self, req: &JoinRequest) -> Placement {
        let report = match &req.failed {
            Some(failed) => self.reported(failed, req.late, req.member),
            None => Report::None,
        };
        let me = match self.by_id.get(&req.member) {
            Some(&i) => {
                self.detach(i);
                self.members[i].alive = true;
                self.members[i].joined = Instant::now();
                i
            }
            None if self.members.len() >= MAX_MEMBERS => {
                return Placement {
                    parent: Parent::Owner,
                    recorded: false,
                    alternates: Vec::new(),
                    report,
                }
            }
            None => {
                // A plain holder under a TLS owner stays a leaf.
                let serves = req.serves.clone().filter(|s| s.tls || !self.tls);
                self.members.push(Member {
                    serves,
                    parent: ROOT,
                    children: 0,
                    helping: 0,
                    helpers: Vec::new(),
                    // Not attached yet.
                    depth: 0,
                    alive: true,
                    demoted: false,
                    demotions: 0,
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
    /// member demotes at most [`MAX_DEMOTIONS_BY_MEMBER`] holders (a failed
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
        if self.members[r].demotions >= MAX_DEMOTIONS_BY_MEMBER {
            return Report::Ignored;
        }
        self.members[r].demotions += 1;
        self.members[h].demoted = true;
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
    pub(crate) fn join(&self, req: &JoinRequest) -> Placement {
        self.tree
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .join(req)
    }
}

/// Every shard's tree at this owner.
#[derive(Debug)]
pub(crate) struct Trackers {
    map: Mutex<HashMap<ShardId, Arc<Tracked>>>,
    fanout: u32,
    sources: u32,
    piece: u64,
    tls: bool,
    keep: Duration,
}

impl Trackers {
    pub(crate) fn new(
        fanout: u32,
        sources: u32,
        piece: u64,
        tls: bool,
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
mod tests {
    use super::*;

    fn holder(n: u8) -> Serves {
        Serves {
            addr: format!("10.0.0.{n}:7071"),
            tls: false,
        }
    }

    const KEEP: Duration = Duration::from_secs(3600);

    fn join(t: &mut Tree, member: u64, failed: Option<u8>) -> Parent {
        t.join(&JoinRequest {
            member,
            from: 0,
            serves: Some(holder(member as u8)),
            failed: failed.map(|f| holder(f).addr),
            late: false,
            alternates: false,
        })
        .parent
    }

    fn via(n: u8) -> Parent {
        Parent::Holder(holder(n))
    }

    #[test]
    fn fanout_one_is_a_chain_in_join_order() {
        let mut t = Tree::new(1, 1, false, KEEP);
        assert_eq!(join(&mut t, 1, None), Parent::Owner);
        for m in 2..=6 {
            assert_eq!(join(&mut t, m, None), via(m as u8 - 1));
        }
    }

    #[test]
    fn fanout_two_fills_the_shallowest_level_first() {
        let mut t = Tree::new(2, 1, false, KEEP);
        let parents: Vec<Parent> = (1..=8).map(|m| join(&mut t, m, None)).collect();
        assert_eq!(
            parents,
            vec![
                Parent::Owner,
                Parent::Owner,
                via(1),
                via(1),
                via(2),
                via(2),
                via(3),
                via(3)
            ]
        );
    }

    #[test]
    fn a_failed_holder_s_children_go_to_its_parent_and_it_may_come_back() {
        let mut t = Tree::new(1, 1, false, KEEP);
        for m in 1..=4 {
            join(&mut t, m, None);
        }
        // 1 <- 2 <- 3 <- 4; 2 dies; 3 reports it and takes 2's slot under 1.
        assert_eq!(join(&mut t, 3, Some(2)), via(1));
        // 4 keeps 3 as its parent (3 kept its subtree); a new joiner goes to
        // the deepest free slot: under 4.
        assert_eq!(join(&mut t, 5, None), via(4));
        // 2 was only late: it rejoins, alive again, below 5.
        assert_eq!(join(&mut t, 2, None), via(5));
    }

    #[test]
    fn a_rejoining_relay_is_never_put_below_itself() {
        let mut t = Tree::new(1, 1, false, KEEP);
        for m in 1..=3 {
            join(&mut t, m, None);
        }
        // 1 <- 2 <- 3; 2 reports 1 failed: 3 (below 2) has a free slot but
        // is 2's own child; the owner's slot (freed by 1) is taken instead.
        assert_eq!(join(&mut t, 2, Some(1)), Parent::Owner);
    }

    #[test]
    fn leaves_take_slots_but_get_no_children() {
        let mut t = Tree::new(1, 1, false, KEEP);
        let leaf = JoinRequest {
            member: 9,
            from: 0,
            serves: None,
            failed: None,
            late: false,
            alternates: false,
        };
        assert_eq!(t.join(&leaf).parent, Parent::Owner);
        // The owner's only slot is the leaf's; nobody else serves: the owner
        // takes the next joiner beyond its fanout.
        assert_eq!(join(&mut t, 1, None), Parent::Owner);
        assert_eq!(join(&mut t, 2, None), via(1));
        assert_eq!(t.holders(), vec![holder(1), holder(2)]);
    }

    #[test]
    fn a_tls_owner_never_sends_anyone_to_a_plain_holder() {
        let mut t = Tree::new(1, 1, true, KEEP);
        assert_eq!(join(&mut t, 1, None), Parent::Owner);
        assert_eq!(join(&mut t, 2, None), Parent::Owner);
        let tls = Serves {
            addr: "10.0.0.3:7071".into(),
            tls: true,
        };
        t.join(&JoinRequest {
            member: 3,
            from: 0,
            serves: Some(tls.clone()),
            failed: None,
            late: false,
            alternates: false,
        });
        let _ = &t;
        assert_eq!(join(&mut t, 4, None), Parent::Holder(tls));
    }

    #[test]
    fn trees_are_bounded() {
        let mut t = Tree::new(1, 1, false, KEEP);
        for m in 0..MAX_MEMBERS as u64 + 10 {
            let p = t.join(&JoinRequest {
                member: m,
                from: 0,
                serves: None,
                failed: None,
                late: false,
                alternates: false,
            });
            assert_eq!(p.recorded, m < MAX_MEMBERS as u64, "member {m}");
        }
        assert_eq!(t.members.len(), MAX_MEMBERS);
    }

    #[test]
    fn only_a_child_can_report_its_parent_failed() {
        let mut t = Tree::new(1, 1, false, KEEP);
        for m in 1..=3 {
            join(&mut t, m, None);
        }
        // 1 <- 2 <- 3; 3 accuses 1 (not its parent): nothing changes, 3
        // stays under 2.
        assert_eq!(join(&mut t, 3, Some(1)), via(2));
        // A stranger's report changes nothing either.
        assert_eq!(join(&mut t, 9, Some(2)), via(3));
    }

    #[test]
    fn members_older_than_relay_keep_are_never_parents() {
        let mut t = Tree::new(1, 1, false, Duration::ZERO);
        assert_eq!(join(&mut t, 1, None), Parent::Owner);
        std::thread::sleep(Duration::from_millis(2));
        // 1's copy may be gone: 2 goes to the owner beyond its fanout.
        assert_eq!(join(&mut t, 2, None), Parent::Owner);
    }

    fn report(t: &mut Tree, member: u64, reported: u8, late: bool) -> Placement {
        t.join(&JoinRequest {
            member,
            from: 0,
            serves: Some(holder_of(member)),
            failed: Some(holder(reported).addr),
            late,
            alternates: true,
        })
    }

    fn holder_of(member: u64) -> Serves {
        holder(member as u8)
    }

    #[test]
    fn a_late_parent_is_demoted_and_rejoins_at_the_tail() {
        let mut t = Tree::new(1, 2, false, KEEP);
        for m in 1..=5 {
            join_multi(&mut t, m, None);
        }
        // owner <- 1 <- 2 <- 3 <- 4 <- 5; 2 reports 1 late: 1 is demoted
        // (to be told to rejoin), 2 takes its slot under the owner.
        let p = report(&mut t, 2, 1, true);
        assert_eq!(p.report, Report::Demoted(holder(1)));
        assert_eq!(p.parent, Parent::Owner);
        // 1 rejoins: at the tail, under 5, out of everyone's path; its
        // alternate is 5's parent.
        let p = join_multi(&mut t, 1, None);
        assert_eq!((p.parent, p.alternates), (via(5), vec![via(4)]));
        assert_eq!(p.report, Report::None);
        // Nobody is given 1 while a healthy holder has a slot: 3 rejoins
        // (say its parent failed) and goes under... the only free slot, 1,
        // is demoted; 2 is 3's own parent, reported by 3: so the owner.
        let p = report(&mut t, 3, 2, false);
        assert_eq!(p.report, Report::Demoted(holder(2)));
        // 3's subtree (4, 5, 1) is below it: the owner beyond its fanout.
        assert_eq!(p.parent, Parent::Owner);
        // A new joiner: no healthy holder has a slot; the demoted tail 1
        // takes it rather than the owner beyond its fanout.
        assert_eq!(join_multi(&mut t, 6, None).parent, via(1));
        // Bounds hold throughout.
        assert!(t.root_helping <= 1);
        for m in &t.members {
            assert!(m.children <= 1 && m.helping <= 1, "{m:?}");
        }
    }

    #[test]
    fn a_demoted_relay_is_never_an_alternate_and_reports_it_was_not_given_change_nothing() {
        let mut t = Tree::new(1, 3, false, KEEP);
        for m in 1..=4 {
            join_multi(&mut t, m, None);
        }
        // owner <- 1 <- 2 <- 3 <- 4; 3's alternate is 1, 4's is 2.
        // 3 reports 1 (its alternate, not its parent) late: demoted, and 3
        // takes the slot it frees.
        let p = report(&mut t, 3, 1, true);
        assert_eq!(p.report, Report::Demoted(holder(1)));
        assert_eq!(p.parent, Parent::Owner);
        // 2, still 1's child until it rejoins, reports it too: demoted
        // already, nothing more to tell.
        assert_eq!(report(&mut t, 2, 1, true).report, Report::Already);
        // 1 is nobody's alternate any more.
        let p = join_multi(&mut t, 4, None);
        assert!(!p.alternates.contains(&via(1)), "{p:?}");
        // Reports about a holder the reporter was never given: ignored,
        // nothing changes.
        let p = report(&mut t, 4, 2, true);
        assert_eq!((p.report, p.parent), (Report::Ignored, via(3)));
        // A stranger (never joined) cannot demote anyone.
        let p = report(&mut t, 77, 3, true);
        assert_eq!(p.report, Report::Ignored);
        // One member demotes at most 4 holders, however many parents it
        // is given and reports: a chain of 12, member 12 reports each
        // parent it gets.
        let mut t = Tree::new(1, 1, false, KEEP);
        for m in 1..=12 {
            join(&mut t, m, None);
        }
        let mut demoted = 0;
        for _ in 0..10 {
            let i = t.by_id[&12];
            let parent = match t.source(t.members[i].parent) {
                // 10.0.0.{n}:7071 serves member n.
                Parent::Holder(s) => s.addr[7..s.addr.len() - 5].parse::<u8>().unwrap(),
                Parent::Owner => break,
            };
            if report(&mut t, 12, parent, true).report != Report::Ignored {
                demoted += 1;
            }
        }
        assert_eq!(demoted, 4);
        assert_eq!(t.members.iter().filter(|m| m.demoted).count(), 4);
        let i3 = t.by_id[&3];
        assert!(!t.members[i3].demoted);
    }

    #[test]
    fn a_demoted_relay_is_never_placed_below_the_children_it_still_has() {
        let mut t = Tree::new(2, 1, false, KEEP);
        for m in 1..=7 {
            join(&mut t, m, None);
        }
        // Fanout 2: owner <- {1, 2}; 1 <- {3, 4}; 2 <- {5, 6}; 3 <- 7.
        // 4 reports 1 late; 3 (and 7 below it) stay under 1 until they
        // rejoin.
        let p = report(&mut t, 4, 1, true);
        assert_eq!(p.report, Report::Demoted(holder(1)));
        // 1 rejoins: the deepest free slot outside its subtree (7 is below
        // it): 5 or 6 (depth 2), the latest recorded.
        let p = join_multi(&mut t, 1, None);
        assert_eq!(p.parent, via(6));
    }

    fn join_multi(t: &mut Tree, member: u64, failed: Option<u8>) -> Placement {
        t.join(&JoinRequest {
            member,
            from: 0,
            serves: Some(holder(member as u8)),
            failed: failed.map(|f| holder(f).addr),
            late: false,
            alternates: true,
        })
    }

    #[test]
    fn alternates_are_the_ancestors_above_the_parent() {
        let mut t = Tree::new(1, 3, false, KEEP);
        let p = join_multi(&mut t, 1, None);
        assert_eq!((p.parent, p.alternates), (Parent::Owner, vec![]));
        let p = join_multi(&mut t, 2, None);
        assert_eq!((p.parent, p.alternates), (via(1), vec![Parent::Owner]));
        // Up to two alternates with relay-sources = 3, each source helping
        // one member (fanout 1): the owner helps 2 already.
        let p = join_multi(&mut t, 3, None);
        assert_eq!((p.parent, p.alternates), (via(2), vec![via(1)]));
        let p = join_multi(&mut t, 4, None);
        assert_eq!((p.parent, p.alternates), (via(3), vec![via(2)]));
        let mut t = Tree::new(2, 3, false, KEEP);
        join_multi(&mut t, 1, None);
        join_multi(&mut t, 2, None);
        // Fanout 2: 1 and 2 under the owner; 3 under 1, helped by the owner.
        let p = join_multi(&mut t, 3, None);
        assert_eq!((p.parent, p.alternates), (via(1), vec![Parent::Owner]));
        let p = join_multi(&mut t, 5, None);
        assert_eq!((p.parent, p.alternates), (via(1), vec![Parent::Owner]));
        // The owner helps two already (its fanout): 6 and 7, under 2, get
        // none; 8, under 3, gets 1.
        let p = join_multi(&mut t, 6, None);
        assert_eq!((p.parent, p.alternates), (via(2), vec![]));
        let p = join_multi(&mut t, 7, None);
        assert_eq!((p.parent, p.alternates), (via(2), vec![]));
        let p = join_multi(&mut t, 8, None);
        assert_eq!((p.parent, p.alternates), (via(3), vec![via(1)]));
        // A joiner that did not ask gets none.
        assert!(t
            .join(&JoinRequest {
                member: 5,
                from: 0,
                serves: Some(holder(5)),
                failed: None,
                late: false,
                alternates: false,
            })
            .alternates
            .is_empty());
    }

    #[test]
    fn no_source_helps_more_than_fanout_members_and_rejoins_give_slots_back() {
        for fanout in [1u32, 2, 3] {
            let mut t = Tree::new(fanout, 2, false, KEEP);
            for m in 1..=40 {
                join_multi(&mut t, m, None);
            }
            assert!(t.root_helping <= fanout);
            for m in &t.members {
                assert!(m.helping <= fanout, "fanout {fanout}: {m:?}");
                assert!(m.children <= fanout, "fanout {fanout}: {m:?}");
                assert!(m.helpers.len() <= 1);
            }
        }
        // Chain 1 <- 2 <- 3 <- 4: 3 has alternate 1; 2 dies, 3 reports it
        // and is placed under 1; its old alternate is given back, and it
        // gets the owner.
        let mut t = Tree::new(1, 2, false, KEEP);
        for m in 1..=4 {
            join_multi(&mut t, m, None);
        }
        let i1 = t.by_id[&1];
        assert_eq!(t.members[i1].helping, 1, "1 helps 3");
        let p = join_multi(&mut t, 3, Some(2));
        assert_eq!(p.parent, via(1));
        assert_eq!(p.alternates, vec![Parent::Owner]);
        assert_eq!(t.members[i1].helping, 0, "given back at the rejoin");
        // A dead member is never named an alternate: 4 (under 3) rejoins
        // and gets 1, 3's parent.
        let p = join_multi(&mut t, 4, None);
        assert_eq!((p.parent, p.alternates), (via(3), vec![via(1)]));
    }
}
