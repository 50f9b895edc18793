use std::{cell::Cell, rc::Rc, sync::Arc};

use super::*;

/// Records of two payload words (a slot and a generation, say).
type Table<'a> = LeaseRecords<'a, 2>;

const RECORDS: u32 = 3;

const HOLDER: Holder = Holder {
    pid: 1,
    start_ticks: 2,
    ns: Namespaces { pid: 3, time: 4 },
};

fn words(records: u32) -> Vec<AtomicU64> {
    (0..Table::words_for(records))
        .map(|_| AtomicU64::new(0))
        .collect()
}

#[test]
fn claims_release_once_and_a_full_table_refuses() {
    let w = words(RECORDS);
    let t = Table::new(&w);
    assert_eq!(t.records(), RECORDS);
    assert_eq!(Table::RECORD_WORDS, 6);
    let a = t.claim(&HOLDER, [1, 7], 0).unwrap();
    let b = t.claim(&HOLDER, [1, 7], 0).unwrap();
    assert_ne!(a, b);
    let c = t.claim(&HOLDER, [2, 7], 2).unwrap();
    assert_eq!(c.index, 2, "searched from the hint");
    assert_eq!(t.claim(&HOLDER, [1, 7], 0), Err(Refused::Full));
    assert_eq!(t.taken(), 3);
    let mut payloads: Vec<_> = t.scan().iter().map(|s| s.payload).collect();
    payloads.sort();
    assert_eq!(payloads, vec![[1, 7], [1, 7], [2, 7]]);
    assert!(t.release(a));
    assert!(!t.release(a), "a second release changes nothing");
    assert!(!t.release(Claim { index: 9, seq: 1 }), "not of this table");
    assert_eq!(t.taken(), 2);
    assert!(t.release(b) && t.release(c));
    assert_eq!(t.taken(), 0);
    assert!(t.scan().is_empty());
    assert_eq!(
        Refused::Reclaimed.to_string(),
        "the owner reclaimed the lease while it was being claimed"
    );
}

#[test]
#[should_panic(expected = "do not fill")]
fn a_table_is_a_whole_number_of_records() {
    let w = words(2);
    let _ = Table::new(&w[1..]);
}

#[test]
fn the_claim_sequence_wraps() {
    let w = words(1);
    let t = Table::new(&w);
    t.forge(
        0,
        &Forged {
            seq: SEQ_MASK,
            state: ClaimState::Free,
            holder: HOLDER,
            tag: SEQ_MASK,
            payload: [0, 0],
        },
    );
    let a = t.claim(&HOLDER, [1, 1], 0).unwrap();
    assert_eq!(a.seq, 0);
    assert_eq!(t.scan()[0].holder, Some(HOLDER));
    assert!(t.release(a));
}

#[test]
fn words_roundtrip() {
    for seq in [0, 1, 0xffff_ffff, 0x1_0000_0000, SEQ_MASK] {
        for state in [ClaimState::Free, ClaimState::Claiming, ClaimState::Held] {
            assert_eq!(
                split_claim_word(claim_word(seq, state)),
                (seq, state as u64)
            );
        }
        for pid in [0, 1, u32::MAX] {
            assert_eq!(split_pid_word(pid_word(pid, seq)), (pid, seq as u32));
        }
    }
}

/// The race a reclaim can meet: the owner judged the claimer dead (an
/// identity recorded wrongly) and reclaims its record in the window between
/// the identity's writing and the claim's publication. The claimer must be
/// refused, and the record must stay the owner's: free, counted by nobody.
#[test]
fn a_claim_reclaimed_while_it_is_being_taken_is_refused_not_revived() {
    let w = Arc::new(words(RECORDS));
    let t = Table::new(&w);
    // The owner, through its own view of the same words.
    let owner_words = Arc::clone(&w);
    let reclaimed = Rc::new(Cell::new(0));
    let count = Rc::clone(&reclaimed);
    let refused = t.claim_observed(&HOLDER, [5, 9], 1, move || {
        let owner = Table::new(&owner_words);
        let scan = owner.scan();
        assert_eq!(scan.len(), 1);
        for lease in scan {
            assert_eq!(lease.holder, Some(HOLDER), "the identity is complete");
            assert_eq!(lease.payload, [5, 9], "so is the payload");
            assert_eq!(lease.index, 1);
            if owner.reclaim(&lease) {
                count.set(count.get() + 1);
            }
        }
    });
    assert_eq!(reclaimed.get(), 1);
    assert_eq!(refused, Err(Refused::Reclaimed));
    // Not revived: the record stays free, so an owner, which counts only
    // records it can see, does not wait on a lease nobody holds.
    assert_eq!(t.taken(), 0);
    assert!(t.scan().is_empty());
    // The table works as before, the same record included.
    let a = t.claim(&HOLDER, [5, 9], 1).unwrap();
    assert_eq!(a.index, 1);
    assert_eq!(t.taken(), 1);
    assert!(t.release(a));
    assert_eq!(t.taken(), 0);
}

#[test]
fn scans_see_whole_holders_and_reclaim_only_that_claim() {
    let w = words(RECORDS);
    let t = Table::new(&w);
    let a = t.claim(&HOLDER, [2, 1], 0).unwrap();
    let scan = t.scan();
    assert_eq!(scan.len(), 1);
    assert_eq!(scan[0].index, a.index);
    assert_eq!(scan[0].payload, [2, 1]);
    assert_eq!(scan[0].holder, Some(HOLDER));

    // Released and claimed again: the old scan no longer describes the
    // record, so reclaiming by it changes nothing.
    assert!(t.release(a));
    let again = t.claim(&HOLDER, [2, 1], a.index).unwrap();
    assert_eq!(again.index, a.index);
    assert!(!t.reclaim(&scan[0]));
    assert_eq!(t.taken(), 1);

    // Reclaiming the current claim frees the record; its holder's release
    // then fails without touching it, even once it is claimed anew.
    let now = t.scan();
    assert!(t.reclaim(&now[0]));
    assert_eq!(t.taken(), 0);
    assert!(!t.reclaim(&now[0]), "reclaimed once");
    let next = t.claim(&HOLDER, [2, 1], a.index).unwrap();
    assert_eq!(next.index, a.index);
    assert!(!t.release(again));
    assert_eq!(t.taken(), 1);
    assert!(t.release(next));
}

#[test]
fn a_torn_record_has_no_holder_and_is_never_reclaimed() {
    let w = words(RECORDS);
    let t = Table::new(&w);
    // A claimer that died after its claim CAS, before tagging its pid: the
    // pid word still carries an earlier claim's tag, and its payload was
    // zeroed by the claim.
    let torn = Forged {
        seq: 41,
        state: ClaimState::Claiming,
        holder: Holder {
            pid: 77,
            start_ticks: 5,
            ns: HOLDER.ns,
        },
        tag: 40,
        payload: [0, 0],
    };
    t.forge(1, &torn);
    let scan = t.scan();
    assert_eq!(scan.len(), 1);
    assert_eq!(scan[0].holder, None, "untagged pid: no holder");
    assert_eq!(scan[0].payload, [0, 0], "names nothing");
    assert!(!t.reclaim(&scan[0]));
    assert_eq!(t.taken(), 1, "the record stays taken");
    // The tag is the low 32 bits of the sequence: another claim's tag does
    // not match.
    t.forge(
        1,
        &Forged {
            tag: 41 + (1 << 32) - 1,
            ..torn
        },
    );
    assert_eq!(t.scan()[0].holder, None);
    // No pid at all: no holder either.
    t.forge(
        1,
        &Forged {
            holder: Holder {
                pid: 0,
                ..torn.holder
            },
            tag: 41,
            ..torn
        },
    );
    assert_eq!(t.scan()[0].holder, None);
    // Tagged with its own claim: complete, and reclaimable, claiming or
    // held.
    for state in [ClaimState::Claiming, ClaimState::Held] {
        t.forge(
            1,
            &Forged {
                tag: 41,
                state,
                ..torn
            },
        );
        let scan = t.scan();
        assert_eq!(scan[0].holder, Some(torn.holder));
        assert!(t.reclaim(&scan[0]));
        assert_eq!(t.taken(), 0);
    }
    // A state no claimer writes counts as taken; reclaimed like any other.
    w[Table::RECORD_WORDS].store(claim_word(41, ClaimState::Free) | 3, SeqCst);
    let scan = t.scan();
    assert_eq!(scan.len(), 1);
    assert!(t.reclaim(&scan[0]));
    assert_eq!(t.taken(), 0);
    // The next claim of the record takes the next sequence.
    let c = t.claim(&HOLDER, [1, 1], 1).unwrap();
    assert_eq!((c.index, c.seq), (1, 42));
}

#[test]
fn concurrent_claims_balance() {
    let w = Arc::new(words(RECORDS));
    let threads: Vec<_> = (0..RECORDS)
        .map(|i| {
            let w = Arc::clone(&w);
            std::thread::spawn(move || {
                let t = Table::new(&w);
                for k in 0..1000 {
                    let c = t.claim(&HOLDER, [u64::from(i), k], i).unwrap();
                    assert!(t.release(c));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let t = Table::new(&w);
    assert_eq!(t.taken(), 0);
    assert!(t.scan().is_empty());
}
