#!/usr/bin/env python3
"""The operator's drill of docs/operations.md, run for real and checked.

Starts a `shardport serve` owner and three long-lived consumers
(`shardport serve --fetch`), then walks the runbook: an A/B experiment of
posix-shm against http with an error-rate guardrail, an injected fault that
trips it, a live fix by reload that keeps the trip and its counter, a reset,
a drained arm (weight 0), a new http build ramped as a canary whose setting
changes mid-ramp, a byte-identical build compared under load (`shardport
bench load` beside it) with the shipped guardrail, and an upgrade finished as
the README says, after which every shard put before it is fetched again
over http and verified. Each step prints `ok` with what it saw, or stops
with what went wrong. Everything runs on loopback; every process and
segment it made is gone when it ends.

    python3 scripts/ab_drill.py [--bin target/release] [--load-seconds 60]

Needs the binary and the plugin libraries built (`cargo build --release
--workspace`). Exit status 0 when every step passed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class DrillFailed(Exception):
    pass


class Node:
    """A running `shardport serve`, its control address and its log."""

    def __init__(self, bin_dir: Path, config: Path, fetch: Path | None = None):
        cmd = [str(bin_dir / "shardport"), "serve", "--config", str(config)]
        if fetch is not None:
            cmd += ["--fetch", str(fetch), "--fetch-every", "5ms"]
        self.log_path = config.with_suffix(".log")
        self.log = open(self.log_path, "w")
        env = {k: v for k, v in os.environ.items() if k != "RUST_LOG"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        first = self.proc.stdout.readline()
        if not first.startswith("control: "):
            self.stop()
            raise DrillFailed(f"{config.name}: serve did not start: {first}{self.log_path.read_text()}")
        self.control = first.split()[1]
        self.config = config
        self.bin_dir = bin_dir

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [str(self.bin_dir / "shardport"), *args], capture_output=True, text=True, timeout=120
        )
        if check and out.returncode != 0:
            raise DrillFailed(f"shardport {' '.join(args)} exited {out.returncode}:\n{out.stdout}{out.stderr}")
        return out

    def metrics(self) -> dict:
        return json.loads(self.cli("metrics", "--node", self.control, "--json").stdout)

    def wait(self, what: str, test, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if test(m):
                return m
            if time.monotonic() > deadline:
                raise DrillFailed(f"{self.config.name}: never happened: {what}\n{json.dumps(m['experiments'])[:2000]}")
            time.sleep(0.05)

    def sighup(self) -> None:
        self.proc.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def arm(m: dict, name: str, exp: int = 0) -> dict:
    return next(a for a in m["experiments"][exp]["arms"] if a["name"] == name)


def _counts(a: dict) -> list[tuple[int, int]]:
    return sorted((v, c) for b in a["latency"] for v, c in b["counts"])


def p99(a: dict) -> float:
    """The p99 (ns) of an arm's whole-run latency histogram."""
    counts = _counts(a)
    total, seen = sum(c for _, c in counts), 0
    for v, c in counts:
        seen += c
        if seen >= 0.99 * total:
            return v
    return 0.0


def pmax(a: dict) -> float:
    counts = _counts(a)
    return counts[-1][0] if counts else 0.0


def ok(step: str, detail: str) -> None:
    print(f"ok    {step}: {detail}", flush=True)


def plugin(name: str, lib: Path, extra: str = "", transport: str | None = None) -> str:
    t = f'transport = "{transport}"\n' if transport else ""
    return f'[[plugin]]\nname = "{name}"\n{t}path = "{lib}"\nrequired = true\n[plugin.config]\n{extra}\n'


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(REPO / "target" / "release"), help="where shardport and the .so files are")
    ap.add_argument("--load-seconds", type=int, default=60, help="how long the byte-identical build runs under load")
    args = ap.parse_args()
    bin_dir = Path(args.bin).resolve()
    libs = {n: bin_dir / f"libshardport_{n}.so" for n in ("posix_shm", "http")}
    for p in [bin_dir / "shardport", *libs.values()]:
        if not p.is_file():
            print(f"missing {p}: build with `cargo build --release --workspace`", file=sys.stderr)
            return 2
    work = Path(tempfile.mkdtemp(prefix="shardport-drill-"))
    prefix = f"drill{os.getpid()}"
    shm = lambda size: plugin("posix-shm", libs["posix_shm"], f'pool-size = "{size}"\nsegment-prefix = "{prefix}"')
    # The "new build": the same library under a new file name, as an
    # operator installs one next to the running build.
    next_lib = work / "libshardport_http-next.so"
    shutil.copy(libs["http"], next_lib)
    nodes: list[Node] = []
    try:
        # 1. The owner.
        owner_cfg = work / "owner.toml"
        owner_text = lambda http_lib, with_next: (
            '[node]\nname = "owner"\n[put]\nstorage = "pool"\npool-transport = "posix-shm"\n'
            '[control]\nbind = "127.0.0.1:0"\n'
            + shm("64MiB")
            + plugin("http", http_lib, 'bind = "127.0.0.1:0"')
            + (plugin("http-next", next_lib, 'bind = "127.0.0.1:0"', transport="http") if with_next else "")
        )
        owner_cfg.write_text(owner_text(libs["http"], True))
        owner = Node(bin_dir, owner_cfg)
        nodes.append(owner)
        handles = [
            owner.cli("put", "--node", owner.control, "--size", "1MiB", "--seed", str(i)).stdout.strip()
            for i in range(1, 9)
        ]
        handle_file = work / "handles.txt"
        handle_file.write_text("\n".join(handles) + "\n")
        ok("owner", f"serving on {owner.control}, 8 shards of 1 MiB put")

        # 2. An A/B consumer: posix-shm against http, 50/50, error-rate guardrail.
        ab_cfg = work / "ab.toml"
        ab_text = lambda http_extra, canary_weight: (
            '[node]\nname = "consumer-ab"\n[control]\nbind = "127.0.0.1:0"\n'
            '[fetch]\nmode = "copy"\non-downgrade = "allow"\n'
            '[[experiment]]\nname = "shm-vs-http"\nunit = "fetch"\n'
            f'arms = [{{ name = "control", transport = "posix-shm", weight = 50 }}, {{ name = "canary", transport = "http", weight = {canary_weight} }}]\n'
            'guardrail = { max-error-rate = 0.05, min-samples = 50, window = "30s", cooldown = "off" }\n'
            + shm("4MiB")
            + plugin("http", libs["http"], 'bind = "127.0.0.1:0"')
            + http_extra
        )
        ab_cfg.write_text(ab_text("", 50))
        ab = Node(bin_dir, ab_cfg, handle_file)
        nodes.append(ab)
        m = ab.wait("both arms serve", lambda m: all(a["fetches"] > 100 for a in m["experiments"][0]["arms"]))
        report = ab.cli("ab", "report", "--node", ab.control).stdout
        if "canary" not in report or "control" not in report:
            raise DrillFailed(f"ab report names no arms:\n{report}")
        ok("a/b", f"control {arm(m, 'control')['fetches']} / canary {arm(m, 'canary')['fetches']} fetches; `ab report --node` reads the consumer")

        # 3. A fault on the canary's transport, applied by SIGHUP: it trips.
        ab_cfg.write_text(ab_text("[plugin.faults]\nseed = 1\nreset = 0.5\n", 50))
        ab.sighup()
        m = ab.wait("the canary trips", lambda m: arm(m, "canary")["state"] == "tripped")
        trips = arm(m, "canary")["guardrail_trips"]
        if m["no_candidate"] != 0:
            raise DrillFailed(f"fetches found no transport: {m['no_candidate']}")
        ok("fault", f"canary tripped ({trips} trip), its fetches fell back to posix-shm ({m['downgrades']} downgrades)")

        # 4. The fix, by `shardport reload` of the node's own file: a new http
        #    instance; the trip and its counter stay.
        ab_cfg.write_text(ab_text("", 50))
        out = ab.cli("reload", "--node", ab.control).stdout
        m = ab.metrics()
        c = arm(m, "canary")
        if c["state"] != "tripped" or c["guardrail_trips"] < trips:
            raise DrillFailed(f"the reload cleared the trip or its counter: {c['state']}, {c['guardrail_trips']}\n{out}")
        if "stays tripped" not in out:
            raise DrillFailed(f"the reload did not say what happened to the arm:\n{out}")
        ok("fix", f"reloaded; canary still tripped, trips {c['guardrail_trips']} (never back)")

        # 5. A bad config is refused by the node and counted.
        bad = work / "bad.toml"
        bad.write_text('[fetch]\nmode = "sideways"\n')
        out = ab.cli("reload", "--node", ab.control, "--config", str(bad), check=False)
        m = ab.metrics()
        if out.returncode != 2 or m["reloads_refused"] != 1:
            raise DrillFailed(f"bad config: exit {out.returncode}, refused {m['reloads_refused']}\n{out.stderr}")
        ok("refusal", "a bad --config reached the node: exit 2, reloads_refused 1, old config serving")

        # 6. The operator resets; the canary serves again.
        ab.cli("ab", "reset", "--node", ab.control)
        seen = arm(ab.metrics(), "canary")["fetches"]
        m = ab.wait("the canary serves again", lambda m: arm(m, "canary")["state"] == "enabled" and arm(m, "canary")["fetches"] > seen + 50)
        ok("reset", "canary enabled and serving")

        # 7. Weight 0 drains it and keeps it configured.
        ab_cfg.write_text(ab_text("", 0))
        ab.sighup()
        m = ab.wait("the drained weights", lambda m: m["reloads"] >= 2 and arm(m, "canary")["weight"] == 0)
        before = arm(m, "canary")["assigned"]
        control_before = arm(m, "control")["assigned"]
        m = ab.wait("fetches after the drain", lambda m: arm(m, "control")["assigned"] > control_before + 200)
        if arm(m, "canary")["assigned"] > before + 1:
            raise DrillFailed("a weight-0 arm still got traffic")
        ok("drain", f"weight 0: canary share {arm(m, 'canary')['share']}, no new draws")

        # 8. A canary build ramped on a remote-style consumer (http only);
        #    one of its settings changes mid-ramp.
        ramp_cfg = work / "canary.toml"
        ramp_text = lambda next_extra: (
            '[node]\nname = "consumer-canary"\n[control]\nbind = "127.0.0.1:0"\n'
            '[fetch]\nmode = "copy"\non-downgrade = "allow"\n'
            '[[experiment]]\nname = "http-build-upgrade"\nunit = "fetch"\n'
            'arms = [{ name = "running", transport = "http", weight = 100 }, { name = "next", transport = "http-next", weight = 1 }]\n'
            'guardrail = { max-error-rate = 0.01, window = "5m", min-samples = 200, cooldown = "30m" }\n'
            'ramp = { arm = "next", steps = [10, 50], interval = "3s" }\n'
            + plugin("http", libs["http"], 'bind = "127.0.0.1:0"')
            + plugin("http-next", next_lib, 'bind = "127.0.0.1:0"\n' + next_extra, transport="http")
        )
        ramp_cfg.write_text(ramp_text(""))
        check = ab.cli("config", "check", str(ramp_cfg)).stdout
        if "next via http-next 10.0%" not in check or "http-next (transport http)" not in check:
            raise DrillFailed(f"config check does not show the instance or the starting share:\n{check}")
        canary = Node(bin_dir, ramp_cfg, handle_file)
        nodes.append(canary)
        canary.wait("the ramp's 50% step", lambda m: m["experiments"][0]["ramp_step"] == 1)
        ramp_cfg.write_text(ramp_text("max-connections-per-owner = 3"))
        canary.cli("reload", "--node", canary.control)
        m = canary.metrics()
        if m["experiments"][0]["ramp_step"] != 1:
            raise DrillFailed(f"the ramp went back: step {m['experiments'][0]['ramp_step']}")
        ok("ramp", f"50% step kept across a changed setting of the new build (share {arm(m, 'next')['share']})")

        # 9. A byte-identical build under load, judged by the shipped
        #    guardrail (`max-p99-ratio = 1.5`, 200 samples over 5 minutes)
        #    and by a short, thin one (5x, 40 samples over 60 s): neither
        #    trips.
        idents = []
        for name, guard in [
            ("shipped", 'max-p99-ratio = 1.5, window = "5m", min-samples = 200'),
            ("thin", 'max-p99-ratio = 5.0, window = "60s", min-samples = 40'),
        ]:
            cfg = work / f"identical-{name}.toml"
            cfg.write_text(
                f'[node]\nname = "identical-{name}"\n[control]\nbind = "127.0.0.1:0"\n'
                '[fetch]\nmode = "copy"\n'
                '[[experiment]]\nname = "identical"\nunit = "fetch"\n'
                'arms = [{ name = "running", transport = "http", weight = 50 }, { name = "next", transport = "http-next", weight = 50 }]\n'
                f'guardrail = {{ max-error-rate = 0.01, {guard}, cooldown = "30m" }}\n'
                + plugin("http", libs["http"], 'bind = "127.0.0.1:0"')
                + plugin("http-next", next_lib, 'bind = "127.0.0.1:0"', transport="http")
            )
            idents.append((name, Node(bin_dir, cfg, handle_file)))
            nodes.append(idents[-1][1])
        load = subprocess.run(
            [str(bin_dir / "shardport"), "bench", "load", "--consumers", "2", "--duration", f"{int(args.load_seconds)}s", "--no-limits"],
            capture_output=True, text=True, timeout=args.load_seconds * 4 + 300,
        )
        if load.returncode != 0:
            raise DrillFailed(f"bench load failed:\n{load.stderr[-2000:]}")
        for name, ident in idents:
            m = ident.metrics()
            run_, nxt = arm(m, "running"), arm(m, "next")
            if nxt["guardrail_trips"] != 0 or nxt["state"] != "enabled":
                raise DrillFailed(f"a byte-identical build tripped ({name} guardrail): {nxt['disabled']}")
            ok(
                f"identical ({name})",
                f"{run_['fetches']} + {nxt['fetches']} fetches beside `bench load` for {args.load_seconds} s: 0 trips; "
                f"whole-run p99 {p99(run_) / 1e3:.0f} / {p99(nxt) / 1e3:.0f} us, max {pmax(run_) / 1e3:.0f} / {pmax(nxt) / 1e3:.0f} us",
            )

        # 10. Finish the upgrade on the owner as the README says; every shard
        #     put before it is fetched again over http, verified.
        owner_cfg.write_text(owner_text(next_lib, False))
        out = owner.cli("reload", "--node", owner.control).stdout
        remote = work / "remote.toml"
        remote.write_text('[fetch]\nmode = "copy"\n' + plugin("http", libs["http"], 'bind = "127.0.0.1:0"'))
        for i, h in enumerate(handles, start=1):
            r = owner.cli("fetch", "--config", str(remote), "--handle", h, "--verify-seed", str(i), check=False)
            if r.returncode != 0 or "verified" not in r.stdout:
                raise DrillFailed(f"shard {i} unreachable after the upgrade:\n{r.stdout}{r.stderr}\n{out}")
        st = json.loads(owner.cli("stats", "--node", owner.control).stdout)
        ok("upgrade", f"8 of 8 old shards verified over http; {len(st['draining'])} old instances draining")

        # 11. Prometheus' linter on every node's scrape, where installed.
        promtool = shutil.which("promtool") or str(REPO / ".tools/prometheus/usr/bin/promtool")
        if Path(promtool).is_file():
            for n in nodes:
                text = n.cli("metrics", "--node", n.control).stdout
                r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
                if r.returncode != 0 or (r.stdout + r.stderr).strip():
                    raise DrillFailed(f"promtool check metrics on {n.config.name}:\n{r.stdout}{r.stderr}")
            ok("promtool", f"check metrics clean on {len(nodes)} nodes")
        else:
            print("skip  promtool: not installed (scripts/setup.sh unpacks it)")
    except DrillFailed as e:
        print(f"FAIL  {e}", file=sys.stderr)
        return 1
    finally:
        for n in reversed(nodes):
            n.stop()
        left = [p for p in os.listdir("/dev/shm") if prefix in p]
        shutil.rmtree(work, ignore_errors=True)
        if left:
            print(f"FAIL  segments left in /dev/shm: {left}", file=sys.stderr)
            return 1
    print("drill passed: every step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
