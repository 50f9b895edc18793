use std::cell::Cell;

use super::*;

/// A probe with fabricated answers.
struct Fake {
    exists: Option<bool>,
    start: ProcStart,
    asked_start: Cell<bool>,
}

impl Probe for Fake {
    fn exists(&self, _pid: u32) -> Option<bool> {
        self.exists
    }
    fn start_ticks(&self, _pid: u32) -> ProcStart {
        self.asked_start.set(true);
        self.start
    }
}

fn fake(exists: Option<bool>, start: ProcStart) -> Fake {
    Fake {
        exists,
        start,
        asked_start: Cell::new(false),
    }
}

const HERE: Here = Here {
    process: ProcessRecord {
        pid: 10,
        start_ticks: 500,
        ns: Namespaces { pid: 7, time: 8 },
        boot: 0xb007,
    },
    proc_is_ours: true,
};

const REC: ProcessRecord = ProcessRecord {
    pid: 42,
    start_ticks: 900,
    ns: Namespaces { pid: 7, time: 8 },
    boot: 0xb007,
};

#[test]
fn the_decision_table() {
    use ProcStart::*;
    use Verdict::*;
    let alive = fake(Some(true), Ticks(900));
    let gone = fake(Some(false), Missing);
    let reused = fake(Some(true), Ticks(901));
    assert_eq!(judge(&REC, &HERE, &alive), Alive);
    assert_eq!(judge(&REC, &HERE, &gone), Dead(Death::Exited));
    assert_eq!(judge(&REC, &HERE, &reused), Dead(Death::PidReused));

    // Nothing is judged across a boot or a PID namespace, or with an
    // unknown field, even a pid that does not exist here (it is another
    // process's pid).
    let cases = [
        ProcessRecord {
            boot: 0xb008,
            ..REC
        },
        ProcessRecord { boot: 0, ..REC },
        ProcessRecord {
            ns: Namespaces { pid: 9, time: 8 },
            ..REC
        },
        ProcessRecord {
            ns: Namespaces { pid: 0, time: 8 },
            ..REC
        },
        ProcessRecord { pid: 0, ..REC },
        ProcessRecord {
            start_ticks: 0,
            ..REC
        },
    ];
    for rec in cases {
        assert!(matches!(judge(&rec, &HERE, &gone), Unknown(_)), "{rec:?}");
        assert!(matches!(judge(&rec, &HERE, &reused), Unknown(_)), "{rec:?}");
    }
    for here in [
        Here {
            process: ProcessRecord {
                ns: Namespaces { pid: 0, time: 8 },
                ..HERE.process
            },
            ..HERE
        },
        Here {
            process: ProcessRecord {
                boot: 0,
                ..HERE.process
            },
            ..HERE
        },
    ] {
        assert!(matches!(judge(&REC, &here, &gone), Unknown(_)), "{here:?}");
    }

    // A failed probe proves nothing.
    assert!(matches!(
        judge(&REC, &HERE, &fake(None, Missing)),
        Unknown(_)
    ));
    // kill sees the pid but /proc does not (hidepid), or cannot read it:
    // not dead.
    for start in [Missing, Unreadable] {
        assert!(matches!(
            judge(&REC, &HERE, &fake(Some(true), start)),
            Unknown(_)
        ));
    }

    // Start times are compared only through our own /proc, in the same
    // time namespace; ESRCH needs neither.
    let foreign_proc = Here {
        proc_is_ours: false,
        ..HERE
    };
    let probe = fake(Some(true), Ticks(901));
    assert!(matches!(judge(&REC, &foreign_proc, &probe), Unknown(_)));
    assert!(!probe.asked_start.get());
    assert_eq!(judge(&REC, &foreign_proc, &gone), Dead(Death::Exited));
    let other_time = ProcessRecord {
        ns: Namespaces { pid: 7, time: 3 },
        ..REC
    };
    let probe = fake(Some(true), Ticks(901));
    assert!(matches!(judge(&other_time, &HERE, &probe), Unknown(_)));
    assert!(!probe.asked_start.get());
    assert_eq!(judge(&other_time, &HERE, &gone), Dead(Death::Exited));
}

#[test]
fn a_holder_is_judged_in_this_boot_without_a_boot_id() {
    use Verdict::*;
    let gone = fake(Some(false), ProcStart::Missing);
    let reused = fake(Some(true), ProcStart::Ticks(901));
    let holder = REC.holder();
    assert_eq!(REC.holder().record(REC.boot), REC);
    // The boot is implied (a board is memory of this boot): judged even
    // where this process could not read its own boot id.
    let no_boot = Here {
        process: ProcessRecord {
            boot: 0,
            ..HERE.process
        },
        ..HERE
    };
    for here in [HERE, no_boot] {
        assert_eq!(judge_holder(&holder, &here, &gone), Dead(Death::Exited));
        assert_eq!(
            judge_holder(&holder, &here, &reused),
            Dead(Death::PidReused)
        );
    }
    // Every other rule holds as for a full record.
    let other_ns = Holder {
        ns: Namespaces { pid: 9, time: 8 },
        ..holder
    };
    assert!(matches!(judge_holder(&other_ns, &HERE, &gone), Unknown(_)));
    assert_eq!(HERE.holder(), HERE.process.holder());
}

#[test]
fn parsing() {
    let stat =
        "7560 (c a) t) R 7556 7556 6613 0 -1 4194304 99 0 0 0 0 0 0 0 20 0 1 0 72317 3133440";
    assert_eq!(parse_stat_start_ticks(stat), Some(72317));
    assert_eq!(parse_stat_start_ticks("1 (x) R"), None);
    let id = 0x6b2ad925_277a_4541_9847_21082ff9412d;
    assert_eq!(
        parse_boot_id("6b2ad925-277a-4541-9847-21082ff9412d\n"),
        Some(id)
    );
    assert_eq!(parse_boot_id("6B2AD925277A4541984721082FF9412D"), Some(id));
    assert_eq!(format_boot_id(id), "6b2ad925-277a-4541-9847-21082ff9412d");
    assert_eq!(parse_boot_id(&format_boot_id(1)), Some(1));
    assert_eq!(parse_boot_id("6b2ad925"), None);
    assert_eq!(parse_boot_id(""), None);
    assert_eq!(parse_boot_id("zz2ad925-277a-4541-9847-21082ff9412d"), None);
    assert_eq!(parse_boot_id("+b2ad925-277a-4541-9847-21082ff9412d"), None);
    assert_eq!(
        parse_boot_id("6b2ad925-277a-4541-9847-21082ff9412d0"),
        None,
        "33 digits"
    );
    assert_eq!(nspid_is_ours("Name:\tx\nNSpid:\t12\n", 12), Some(true));
    assert_eq!(nspid_is_ours("NSpid:\t900\t12\n", 12), Some(false));
    assert_eq!(nspid_is_ours("NSpid:\t13\n", 12), Some(false));
    assert_eq!(nspid_is_ours("Name:\tx\n", 12), None);
    let ns = Namespaces {
        pid: 4026531836,
        time: 4026531834,
    };
    assert_eq!(Namespaces::from_word(ns.to_word()), ns);
}

#[test]
fn this_process_knows_itself_and_is_alive() {
    let here = Here::current();
    let me = here.process;
    assert_eq!(me.pid, std::process::id());
    assert!(
        me.start_ticks > 0 && me.boot != 0 && me.ns.pid != 0,
        "{me:?}"
    );
    assert_eq!(boot_id(), Some(me.boot));
    assert_eq!(start_ticks(me.pid), Some(me.start_ticks));
    assert!(here.proc_is_ours);
    assert_eq!(judge(&me, &here, &System), Verdict::Alive);
    assert_eq!(judge_holder(&here.holder(), &here, &System), Verdict::Alive);
    let reused = ProcessRecord {
        start_ticks: me.start_ticks + 1,
        ..me
    };
    assert_eq!(
        judge(&reused, &here, &System),
        Verdict::Dead(Death::PidReused)
    );
    assert_eq!(System.exists(0), None, "0 would mean our process group");
    assert_eq!(System.exists(u32::MAX), None, "negative pids are groups");
}

#[test]
fn a_reaped_child_is_dead() {
    let here = Here::current();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "lease::liveness::tests::no-such-test", "-q"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let rec = Holder {
        pid: child.id(),
        start_ticks: start_ticks(child.id()).unwrap_or(1),
        ..here.holder()
    };
    child.wait().unwrap();
    // Reaped: its pid is free (or, rarely, already another process's).
    assert!(matches!(
        judge_holder(&rec, &here, &System),
        Verdict::Dead(_)
    ));
}

#[test]
fn the_stat_file_is_read_whole_and_a_missing_pid_is_not_found() {
    let me = std::process::id();
    let lean = read_stat(me).unwrap();
    let whole = std::fs::read_to_string(format!("/proc/{me}/stat")).unwrap();
    // The same line (the start time and everything before the counters
    // that change while a process runs), ending where the file ends.
    assert!(lean.ends_with('\n'), "{lean:?}");
    assert_eq!(
        parse_stat_start_ticks(&lean),
        parse_stat_start_ticks(&whole)
    );
    assert_eq!(
        lean.split_whitespace().take(4).collect::<Vec<_>>(),
        whole.split_whitespace().take(4).collect::<Vec<_>>()
    );
    assert_eq!(start_ticks(me), parse_stat_start_ticks(&whole));
    // No such process (pid_max is at most 2^22): the error says not found,
    // which `System::start_ticks` reports as `Missing`.
    let e = read_stat(u32::MAX).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    assert_eq!(System.start_ticks(u32::MAX), ProcStart::Missing);
}
