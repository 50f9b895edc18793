//! The owner's reclamation of dead consumers' leases, with real consumer
//! processes and no GPU: the owner's books (`books`) over a real board
//! segment, an export's memory played by a value whose drop is counted, and
//! consumers that are this test binary re-executed as [`lessee_child`]:
//! each takes a lease on the board, says so on its stdout, and waits to be
//! killed (SIGKILL: no destructor, no release).

use std::{
    io::{BufRead, BufReader, Write},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use shardport_abi::ShardId;

use shardport_kit::lease::liveness::{Here, Holder};

use crate::{
    board::{target_word, Board, Layout, SlotState},
    books::{Books, Published, Reaped, Scope},
    sys::BoardMap,
};

/// Set in a re-executed test binary: `<board name> <slot> <generation>`.
const CHILD_ENV: &str = "SHARDPORT_CUDA_IPC_TEST_LESSEE";

const LAYOUT: Layout = Layout {
    slots: 4,
    records: 8,
};

/// An export's memory: counts its frees.
#[derive(Debug)]
struct Memory(Arc<AtomicUsize>);

impl Drop for Memory {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Owner books over a board of a name unique to this test.
fn books(test: &str) -> (Books<Memory>, String) {
    let name = format!("/shardport-cuda-test-{}-{test}", std::process::id());
    let mut b = Books::new(LAYOUT, Here::current());
    b.board(&name).expect("board");
    (b, name)
}

/// Exports one shard; returns its slot, generation and free counter.
fn export(b: &mut Books<Memory>, id: u128) -> (u32, u64, Arc<AtomicUsize>) {
    let (slot, generation) = b.publish().expect("a free slot");
    let freed = Arc::new(AtomicUsize::new(0));
    b.insert(
        ShardId::from_u128(id),
        Published {
            slot,
            generation,
            value: Memory(Arc::clone(&freed)),
        },
    );
    (slot, generation, freed)
}

/// A consumer process holding one lease; killed (and reaped) on drop if
/// the test did not.
struct Lessee {
    child: Child,
    pid: u32,
}

impl Lessee {
    fn spawn(board: &str, slot: u32, generation: u64) -> Lessee {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "reclaim_tests::lessee_child", "--test-threads=1"])
            .env(CHILD_ENV, format!("{board} {slot} {generation}"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the lessee");
        let pid = child.id();
        // Blocks until the child has its lease (or died: EOF).
        let out = BufReader::new(child.stdout.take().expect("piped"));
        let leased = out
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("LEASED "));
        let mut l = Lessee { child, pid };
        if !leased {
            let status = l.child.wait();
            panic!("the lessee exited without a lease: {status:?}");
        }
        l
    }

    /// SIGKILL, then reap: the process is gone, its lease still on the board.
    fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }
}

impl Drop for Lessee {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The consumer side, run only in a re-executed test binary (a no-op in
/// the normal run): leases, reports, then waits to be killed.
#[test]
fn lessee_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut it = spec.split(' ');
    let (name, slot, generation) = (
        it.next().unwrap().to_owned(),
        it.next().unwrap().parse::<u32>().unwrap(),
        it.next().unwrap().parse::<u64>().unwrap(),
    );
    let board = Board::attach(BoardMap::open(&name).expect("open the board")).expect("attach");
    let ticket = board
        .lease(slot, generation, &Here::current().holder(), 0)
        .expect("lease");
    // Straight to the stdout pipe: `println!` would be captured by the
    // test harness.
    let mut out = std::io::stdout();
    writeln!(out, "LEASED {}", ticket.index).unwrap();
    out.flush().unwrap();
    loop {
        std::thread::park();
    }
}

#[test]
fn a_killed_lessee_s_lease_is_reclaimed_and_the_retired_slot_freed() {
    let (mut b, name) = books("killed");
    let (slot, generation, freed) = export(&mut b, 1);
    let lessee = Lessee::spawn(&name, slot, generation);
    assert_eq!(b.leases_held(), 1);

    // Unexport while the consumer maps it: kept, not freed.
    let (held, reaped) = b.unexport(&ShardId::from_u128(1)).unwrap();
    assert_eq!((held, reaped), (1, Reaped::default()));
    assert_eq!(freed.load(Ordering::SeqCst), 0);
    assert_eq!(b.deferred_len(), 1);
    assert_eq!(b.leases_held(), 1);
    // Still alive: a reap changes nothing.
    assert_eq!(b.reap(Scope::Retired), Reaped::default());
    assert_eq!(freed.load(Ordering::SeqCst), 0);

    lessee.kill();
    let r = b.reap(Scope::Retired);
    assert_eq!(
        r,
        Reaped {
            reclaimed: 1,
            freed: 1
        }
    );
    assert_eq!(freed.load(Ordering::SeqCst), 1, "the memory was freed once");
    assert_eq!(b.deferred_len(), 0);
    assert_eq!(b.leases_held(), 0);
    let board = Board::attach(BoardMap::open(&name).unwrap()).unwrap();
    assert_eq!(board.slot(slot).state, SlotState::Free);
    assert!(board.scan().is_empty(), "the record is free");
    // The slot is reusable, with a new generation (slots are taken round
    // robin: the other three first).
    for id in 2..=4 {
        assert_ne!(export(&mut b, id).0, slot);
    }
    let (slot2, generation2, _) = export(&mut b, 5);
    assert_eq!((slot2, generation2), (slot, generation + 1));
    assert_eq!(b.reap(Scope::All), Reaped::default(), "nothing more");
}

#[test]
fn unexport_after_the_lessee_died_frees_at_once() {
    let (mut b, name) = books("unexport");
    let (slot, generation, freed) = export(&mut b, 1);
    Lessee::spawn(&name, slot, generation).kill();
    assert_eq!(b.leases_held(), 1, "a dead lease counts until reclaimed");
    let (held, reaped) = b.unexport(&ShardId::from_u128(1)).unwrap();
    assert_eq!(held, 0);
    assert_eq!(
        reaped,
        Reaped {
            reclaimed: 1,
            freed: 1
        }
    );
    assert_eq!(freed.load(Ordering::SeqCst), 1);
    assert_eq!(b.leases_held(), 0);
}

#[test]
fn a_live_lessee_s_lease_is_never_reclaimed() {
    let (mut b, name) = books("live");
    let (slot, generation, freed) = export(&mut b, 1);
    let lessee = Lessee::spawn(&name, slot, generation);
    // This process leases too (a live holder whose record we also see).
    let board = Board::attach(BoardMap::open(&name).unwrap()).unwrap();
    let mine = board
        .lease(slot, generation, &Here::current().holder(), 5)
        .unwrap();
    for _ in 0..3 {
        assert_eq!(b.reap(Scope::All), Reaped::default());
        assert_eq!(b.leases_held(), 2);
    }
    let (held, _) = b.unexport(&ShardId::from_u128(1)).unwrap();
    assert_eq!(held, 2);
    for _ in 0..3 {
        assert_eq!(b.reap(Scope::All), Reaped::default());
    }
    assert_eq!(freed.load(Ordering::SeqCst), 0, "never freed under a lease");
    assert_eq!(b.deferred_len(), 1);

    // Only the dead one's lease goes; ours keeps the memory.
    lessee.kill();
    assert_eq!(
        b.reap(Scope::Retired),
        Reaped {
            reclaimed: 1,
            freed: 0
        }
    );
    assert_eq!(b.leases_held(), 1);
    assert_eq!(freed.load(Ordering::SeqCst), 0);
    assert!(board.release(mine), "our lease was untouched");
    assert_eq!(
        b.reap(Scope::Retired),
        Reaped {
            reclaimed: 0,
            freed: 1
        }
    );
    assert_eq!(freed.load(Ordering::SeqCst), 1);
}

#[test]
fn sweep_reclaims_dead_leases_on_exported_shards() {
    let (mut b, name) = books("sweep");
    let (slot, generation, freed) = export(&mut b, 1);
    Lessee::spawn(&name, slot, generation).kill();
    assert_eq!(b.leases_held(), 1);
    // Export/unexport reaps look at retired slots only.
    assert_eq!(b.reap(Scope::Retired), Reaped::default());
    assert_eq!(b.leases_held(), 1);
    // Sweep looks at every record.
    assert_eq!(
        b.reap(Scope::All),
        Reaped {
            reclaimed: 1,
            freed: 0
        }
    );
    assert_eq!(b.leases_held(), 0);
    assert_eq!(freed.load(Ordering::SeqCst), 0, "still exported");
    assert!(b.get(&ShardId::from_u128(1)).is_some());
}

#[test]
fn a_torn_record_of_a_dead_process_is_never_reclaimed() {
    let (mut b, name) = books("torn");
    let (slot, generation, freed) = export(&mut b, 1);
    // A process that is provably dead: spawned, killed, reaped.
    let dead = {
        let l = Lessee::spawn(&name, slot, generation);
        let pid = l.pid;
        l.kill();
        pid
    };
    assert_eq!(b.reap(Scope::All).reclaimed, 1, "its real lease");
    let here = Here::current().holder();
    let corpse = Holder { pid: dead, ..here };
    let board = Board::attach(BoardMap::open(&name).unwrap()).unwrap();
    // Held, naming the slot, but the pid word carries another claim's tag
    // (as if written by an earlier claim): identity unproven.
    board.forge(3, 10, true, &corpse, 9, target_word(slot, generation));
    // Claiming, tag missing, target not written yet.
    board.forge(4, 20, false, &corpse, 19, 0);
    let (held, reaped) = b.unexport(&ShardId::from_u128(1)).unwrap();
    assert_eq!((held, reaped), (1, Reaped::default()));
    for scope in [Scope::Retired, Scope::All] {
        assert_eq!(b.reap(scope), Reaped::default());
    }
    assert_eq!(freed.load(Ordering::SeqCst), 0, "the owner waits");
    assert_eq!(board.scan().len(), 2, "both records stay taken");

    // Once the record is complete (tagged with its own claim), the dead
    // holder loses it and the memory is freed.
    board.forge(3, 10, true, &corpse, 10, target_word(slot, generation));
    assert_eq!(
        b.reap(Scope::Retired),
        Reaped {
            reclaimed: 1,
            freed: 1
        }
    );
    assert_eq!(freed.load(Ordering::SeqCst), 1);
    // The untagged claiming record stays, even for a full sweep.
    assert_eq!(b.reap(Scope::All), Reaped::default());
    assert_eq!(board.scan().len(), 1);
}
