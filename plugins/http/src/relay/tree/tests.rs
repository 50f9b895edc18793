//! Unit tests of the owner's relay trees: placement, reports, demotion.
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
        serves: Some(holder(member as u8)),
        failed: failed.map(|f| holder(f).addr),
        ..JoinRequest::default()
    })
    .parent
}

fn via(n: u8) -> Parent {
    Parent::Holder(holder(n))
}

#[test]
fn fanout_one_is_a_chain_in_join_order() {
    let mut t = Tree::new(1, 1, TlsPolicy::default(), KEEP);
    assert_eq!(join(&mut t, 1, None), Parent::Owner);
    for m in 2..=6 {
        assert_eq!(join(&mut t, m, None), via(m as u8 - 1));
    }
}

#[test]
fn fanout_two_fills_the_shallowest_level_first() {
    let mut t = Tree::new(2, 1, TlsPolicy::default(), KEEP);
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
    let mut t = Tree::new(1, 1, TlsPolicy::default(), KEEP);
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
    let mut t = Tree::new(1, 1, TlsPolicy::default(), KEEP);
    for m in 1..=3 {
        join(&mut t, m, None);
    }
    // 1 <- 2 <- 3; 2 reports 1 failed: 3 (below 2) has a free slot but
    // is 2's own child; the owner's slot (freed by 1) is taken instead.
    assert_eq!(join(&mut t, 2, Some(1)), Parent::Owner);
}

#[test]
fn leaves_take_slots_but_get_no_children() {
    let mut t = Tree::new(1, 1, TlsPolicy::default(), KEEP);
    let leaf = JoinRequest {
        member: 9,
        ..JoinRequest::default()
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
    let mut t = Tree::new(
        1,
        1,
        TlsPolicy {
            tls: true,
            client_auth: false,
        },
        KEEP,
    );
    assert_eq!(join(&mut t, 1, None), Parent::Owner);
    assert_eq!(join(&mut t, 2, None), Parent::Owner);
    let tls = Serves {
        addr: "10.0.0.3:7071".into(),
        tls: true,
    };
    t.join(&JoinRequest {
        member: 3,
        serves: Some(tls.clone()),
        ..JoinRequest::default()
    });
    let _ = &t;
    assert_eq!(join(&mut t, 4, None), Parent::Holder(tls));
}

#[test]
fn trees_are_bounded() {
    let mut t = Tree::new(1, 1, TlsPolicy::default(), KEEP);
    for m in 0..MAX_MEMBERS as u64 + 10 {
        let p = t.join(&JoinRequest {
            member: m,
            ..JoinRequest::default()
        });
        assert_eq!(p.recorded, m < MAX_MEMBERS as u64, "member {m}");
    }
    assert_eq!(t.members.len(), MAX_MEMBERS);
}

#[test]
fn only_a_child_can_report_its_parent_failed() {
    let mut t = Tree::new(1, 1, TlsPolicy::default(), KEEP);
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
    let mut t = Tree::new(1, 1, TlsPolicy::default(), Duration::ZERO);
    assert_eq!(join(&mut t, 1, None), Parent::Owner);
    std::thread::sleep(Duration::from_millis(2));
    // 1's copy may be gone: 2 goes to the owner beyond its fanout.
    assert_eq!(join(&mut t, 2, None), Parent::Owner);
}

fn report(t: &mut Tree, member: u64, reported: u8, late: bool) -> Placement {
    t.join(&JoinRequest {
        member,
        serves: Some(holder_of(member)),
        failed: Some(holder(reported).addr),
        late,
        alternates: true,
        ..JoinRequest::default()
    })
}

fn holder_of(member: u64) -> Serves {
    holder(member as u8)
}

#[test]
fn a_late_parent_is_demoted_and_rejoins_at_the_tail() {
    let mut t = Tree::new(1, 2, TlsPolicy::default(), KEEP);
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
    let mut t = Tree::new(1, 3, TlsPolicy::default(), KEEP);
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
    let mut t = Tree::new(1, 1, TlsPolicy::default(), KEEP);
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
    let mut t = Tree::new(2, 1, TlsPolicy::default(), KEEP);
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
        serves: Some(holder(member as u8)),
        failed: failed.map(|f| holder(f).addr),
        alternates: true,
        ..JoinRequest::default()
    })
}

#[test]
fn alternates_are_the_ancestors_above_the_parent() {
    let mut t = Tree::new(1, 3, TlsPolicy::default(), KEEP);
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
    let mut t = Tree::new(2, 3, TlsPolicy::default(), KEEP);
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
            serves: Some(holder(5)),
            ..JoinRequest::default()
        })
        .alternates
        .is_empty());
}

#[test]
fn no_source_helps_more_than_fanout_members_and_rejoins_give_slots_back() {
    for fanout in [1u32, 2, 3] {
        let mut t = Tree::new(fanout, 2, TlsPolicy::default(), KEEP);
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
    let mut t = Tree::new(1, 2, TlsPolicy::default(), KEEP);
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

/// A join of `member` serving as `serves` from `peer`, reporting `failed`.
fn join_at(t: &mut Tree, member: u64, serves: u8, failed: Option<u8>, peer: [u8; 4]) -> Placement {
    t.join_from(
        &JoinRequest {
            member,
            serves: Some(holder(serves)),
            failed: failed.map(|f| holder(f).addr),
            ..JoinRequest::default()
        },
        Some(IpAddr::from(peer)),
    )
}

#[test]
fn a_demoted_holder_that_rejoins_under_a_fresh_id_stays_demoted() {
    let mut t = Tree::new(1, 1, TlsPolicy::default(), KEEP);
    join_at(&mut t, 1, 1, None, [10, 0, 0, 1]);
    join_at(&mut t, 2, 2, None, [10, 0, 0, 2]);
    // 2 reports its parent 1: 1 is demoted.
    let p = join_at(&mut t, 2, 2, Some(1), [10, 0, 0, 2]);
    assert_eq!(p.report, Report::Demoted(holder(1)));
    // 1 comes back as a new member id, from the same address: demoted at
    // once (placed at the tail, never an alternate, a parent only when no
    // other holder has a slot).
    join_at(&mut t, 99, 1, None, [10, 0, 0, 1]);
    assert!(
        t.members[t.by_id[&99]].demoted,
        "a fresh id undid a demotion"
    );
    // Another holder at another address is not.
    join_at(&mut t, 98, 7, None, [10, 0, 0, 1]);
    assert!(!t.members[t.by_id[&98]].demoted);
}

#[test]
fn one_client_demotes_at_most_four_holders_whatever_ids_it_uses() {
    let mut t = Tree::new(8, 1, TlsPolicy::default(), KEEP);
    for h in 1..=6u8 {
        join_at(&mut t, u64::from(h), h, None, [10, 0, 1, h]);
    }
    // The attacker joins with many ids from one address; each id is given
    // honest holders as parents and reports them.
    let mut demoted = 0;
    for id in 100..140u64 {
        let placed = join_at(&mut t, id, 50, None, [10, 0, 9, 9]);
        if let Parent::Holder(s) = placed.parent {
            let n: u8 = s
                .addr
                .split('.')
                .nth(3)
                .unwrap()
                .split(':')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            if matches!(
                join_at(&mut t, id, 50, Some(n), [10, 0, 9, 9]).report,
                Report::Demoted(_)
            ) {
                demoted += 1;
            }
        }
    }
    assert_eq!(demoted, usize::from(MAX_DEMOTIONS_BY_CLIENT));
}

#[test]
fn a_join_flood_from_one_address_cannot_fill_a_tree() {
    let mut t = Tree::new(1, 1, TlsPolicy::default(), KEEP);
    let mut recorded = 0;
    for id in 0..(MAX_MEMBERS as u64 + 100) {
        if join_at(&mut t, 1000 + id, 200, None, [10, 0, 9, 9]).recorded {
            recorded += 1;
        }
    }
    assert_eq!(recorded, MAX_MEMBERS_BY_CLIENT);
    // An honest consumer from another address is still recorded and relays.
    let p = join_at(&mut t, 1, 1, None, [10, 0, 0, 1]);
    assert!(p.recorded);
    let p = join_at(&mut t, 2, 2, None, [10, 0, 0, 2]);
    assert!(p.recorded && p.parent != Parent::Owner, "{p:?}");
}
