"""deploy/grafana/shardport.json and deploy/prometheus/shardport-rules.yml
against live nodes.

The dashboard and the alerting rules are only useful if every series they
query exists: a misspelt name or a `stat` label value that no plugin reports
gives an empty panel or an alert that can never fire, and nothing says so.
So this test pulls every metric name (and every fixed label value) out of
their PromQL, starts a real owner (`shardport serve`, control endpoint with
a bearer token) and a consumer library node that fetches from it through
shared memory and http under an A/B experiment, and checks that the nodes'
`/metrics` text serves each one.

The consumer is a library node (as in a training or rollout process): it
has no control endpoint of its own; its program serves `node.metrics()` at
its `/metrics` (deploy/k8s does), which is the same text a control endpoint
serves. Fetch, latency and experiment series exist only on nodes that fetch,
pool and lease series mostly on owners, so a name passes when either node
serves it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

import shardport

from helpers import config

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "shardport.json"
RULES = REPO / "deploy" / "prometheus" / "shardport-rules.yml"

#: Series Prometheus makes itself for every target: no node serves them.
PROMETHEUS_OWN = {"up"}

#: PromQL functions, aggregation operators and keywords: identifiers in an
#: expression that are not metric names.
NOT_METRICS = {
    # aggregation operators
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk",
    "quantile", "count_values", "group", "limitk", "limit_ratio",
    # keywords and modifiers
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "and", "or", "unless", "offset", "atan2", "inf", "nan",
    # functions
    "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max",
    "clamp_min", "day_of_month", "day_of_week", "day_of_year", "days_in_month",
    "delta", "deriv", "exp", "floor", "histogram_avg", "histogram_count",
    "histogram_fraction", "histogram_quantile", "histogram_stddev",
    "histogram_stdvar", "histogram_sum", "holt_winters", "hour", "idelta",
    "increase", "irate", "label_join", "label_replace", "ln", "log2", "log10",
    "minute", "month", "predict_linear", "rate", "resets", "round", "scalar",
    "sgn", "sort", "sort_desc", "sqrt", "time", "timestamp", "vector", "year",
    "avg_over_time", "min_over_time", "max_over_time", "sum_over_time",
    "count_over_time", "quantile_over_time", "stddev_over_time",
    "stdvar_over_time", "last_over_time", "present_over_time",
    # Grafana's template-variable query function
    "label_values",
}

STRING = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\''
IDENT = r"[A-Za-z_:][A-Za-z0-9_:]*"


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana `label_values`
    query) selects: identifiers outside label matchers, label lists,
    strings and range brackets that are neither functions nor keywords."""
    e = re.sub(STRING, '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)  # ranges and subqueries
    # Label lists of grouping and matching modifiers: `by (node, le)`.
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", e)
    # Grafana: label_values(metric, label) names a metric, then a label.
    e = re.sub(r"label_values\(\s*([^,()]*?)\s*,\s*\w+\s*\)", r" \1 ", e)
    e = re.sub(r"label_values\(\s*\w+\s*\)", " ", e)
    names = set()
    for m in re.finditer(rf"(?<![\w$.:]){IDENT}", e):
        name = m.group(0)
        called = e[m.end():].lstrip().startswith("(")
        if not called and name not in NOT_METRICS:
            names.add(name)
    return names


def fixed_matchers(expr: str) -> list[tuple[str, str, list[str]]]:
    """(metric, label, values) for each `label="v"` or `label=~"a|b"`
    matcher on a named metric; template variables (`$node`) and real
    regular expressions are left out: no fixed value to look for."""
    out = []
    for sel in re.finditer(rf"({IDENT})\s*\{{([^}}]*)\}}", expr):
        metric, body = sel.group(1), sel.group(2)
        for m in re.finditer(r'(\w+)\s*(=~|=)\s*"((?:[^"\\]|\\.)*)"', body):
            label, op, value = m.groups()
            if "$" in value:
                continue
            if op == "=":
                out.append((metric, label, [value]))
            elif re.fullmatch(r"[\w]+(\|[\w]+)*", value):
                out.append((metric, label, value.split("|")))
    return out


def dashboard_queries() -> list[str]:
    d = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]
            exprs.append(q["query"] if isinstance(q, dict) else q)
    return exprs


def rule_exprs() -> list[str]:
    d = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in d["groups"] for r in g["rules"]]


def test_the_extractor_finds_metric_names_and_only_them():
    expr = (
        'histogram_quantile(0.99, sum by (arm, le) (rate(a_bucket{arm="x",le!="1"}[$__rate_interval])))'
        ' / ignoring(arm) group_left max without (node) (b) > 1e-3 and on (node) c_total offset 5m'
    )
    assert metric_names(expr) == {"a_bucket", "b", "c_total"}
    assert metric_names('label_values(shardport_reloads_total{job=~"$job"}, node)') == {"shardport_reloads_total"}
    assert metric_names("label_values(node)") == set()
    assert fixed_matchers('g{stat="x",node=~"$node",state=~"a|b",t=~"h.*"}') == [
        ("g", "stat", ["x"]),
        ("g", "state", ["a", "b"]),
    ]


def test_the_rules_file_parses_and_every_rule_is_complete():
    d = yaml.safe_load(RULES.read_text())
    assert isinstance(d, dict) and list(d) == ["groups"], list(d)
    assert d["groups"], "no rule groups"
    alerts = []
    for g in d["groups"]:
        assert set(g) == {"name", "rules"}, g.keys()
        assert g["rules"], f"group {g['name']} has no rules"
        for r in g["rules"]:
            name = r.get("alert")
            assert set(r) == {"alert", "expr", "for", "labels", "annotations"}, (name, r.keys())
            assert re.fullmatch(r"Shardport[A-Z][A-Za-z]+", name), name
            assert re.fullmatch(r"\d+[smhd]", str(r["for"])), (name, r["for"])
            assert r["labels"].get("severity") in {"critical", "warning", "info"}, name
            for key in ("summary", "description"):
                assert isinstance(r["annotations"].get(key), str) and r["annotations"][key].strip(), (name, key)
            e = r["expr"]
            assert e.count("(") == e.count(")") and e.count("{") == e.count("}"), (name, e)
            assert metric_names(e), f"{name} selects no metric"
            alerts.append(name)
    assert len(alerts) == len(set(alerts)), "duplicate alert names"

    # What the rules are for: each situation has a rule selecting its series.
    selected = {}
    for r in (r for g in d["groups"] for r in g["rules"]):
        for m in metric_names(r["expr"]):
            selected.setdefault(m, []).append(r["expr"])
    for metric, must_contain in [
        ("shardport_experiment_arm_state", "tripped"),  # guardrail tripped
        ("shardport_downgrades_total", ""),  # downgrade rate
        ("shardport_plugin_current", "pool_bytes_total"),  # pool near full
        ("shardport_plugin_current", "leases_held_on_owner"),  # leases held
        ("shardport_reloads_total", 'result="refused"'),  # reload refused
        ("shardport_plugin_events_total", "requests_failed"),  # plugin failing
        ("shardport_fetch_errors_total", "shardport_fetches_total"),  # error ratio
    ]:
        assert any(must_contain in e for e in selected.get(metric, [])), (metric, must_contain)


def _promtool() -> str | None:
    """Prometheus' checker: on PATH, or where scripts/setup.sh unpacked it."""
    import shutil

    found = shutil.which("promtool")
    local = REPO / ".tools" / "prometheus" / "usr" / "bin" / "promtool"
    return found or (str(local) if local.exists() else None)


def test_prometheus_itself_accepts_the_rules(tmp_path):
    """The checks above are ours; promtool parses every expression as
    Prometheus would load it (PromQL syntax, durations, label names)."""
    promtool = _promtool()
    if promtool is None:
        pytest.skip("promtool not found (scripts/setup.sh unpacks it from Debian's prometheus package)")

    def check(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
        )

    out = check(RULES)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout, out.stdout
    # And it refuses a broken expression: the check can fail.
    text = RULES.read_text()
    broken = text.replace("sum by (node) (", "sum by (node ((", 1)
    assert broken != text, "the rules have a `sum by (node) (` to break"
    (tmp_path / "broken.yml").write_text(broken)
    assert check(tmp_path / "broken.yml").returncode != 0


def test_the_dashboard_is_a_grafana_dashboard_with_a_datasource_and_node_choice():
    d = json.loads(DASHBOARD.read_text())
    assert d["schemaVersion"] >= 36 and d["uid"] and d["title"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["node"]["type"] == "query"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for p in d["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            assert t["expr"].count("(") == t["expr"].count(")"), (p["title"], t["expr"])
            assert metric_names(t["expr"]), (p["title"], t["expr"])
    # Percentiles come from the real histogram buckets, per transport and per arm.
    exprs = " ".join(dashboard_queries())
    for h in ("shardport_fetch_latency_seconds_bucket", "shardport_experiment_latency_seconds_bucket"):
        assert re.search(rf"histogram_quantile\(0\.99, sum by \([^)]*\ble\b[^)]*\) \(rate\({h}\{{", exprs), h


# --- the live check ---------------------------------------------------------------


def shardport_binary() -> Path:
    """The CLI that `cargo test --workspace` (scripts/test.sh) builds:
    $SHARDPORT_BIN, else the newer of target/release and target/debug."""
    if os.environ.get("SHARDPORT_BIN"):
        return Path(os.environ["SHARDPORT_BIN"])
    found = [p for p in (REPO / "target" / d / "shardport" for d in ("release", "debug")) if p.is_file()]
    if not found:
        pytest.fail("no shardport executable: build it with `cargo build -p shardport-cli` (or set SHARDPORT_BIN)")
    return max(found, key=lambda p: p.stat().st_mtime)


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample in Prometheus text format."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"(" + IDENT + r")(\{(.*)\})? (\S+)", line)
        assert m, f"unparsable sample line: {line!r}"
        pairs = re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or "")
        labels = {k: bytes(v, "utf-8").decode("unicode_escape") for k, v in pairs}
        out.append((m.group(1), labels, float(m.group(4))))
    return out


def value(samples, name: str, **labels: str) -> float:
    hits = [v for n, ls, v in samples if n == name and all(ls.get(k) == x for k, x in labels.items())]
    assert hits, f"no sample {name} {labels}"
    return sum(hits)


TOKEN = "monitoring-test-token"


def control(addr: str, method: str, path: str, body: bytes | None = None, token: str | None = TOKEN):
    req = urllib.request.Request(f"http://{addr}{path}", data=body, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


def owner_config(prefix: str, plugin_dir: Path) -> str:
    return f"""
[node]
name = "monitoring-owner"
advertise = "127.0.0.1:0"

[control]
bind = "127.0.0.1:0"
auth-token-env = "SHARDPORT_MONITORING_TOKEN"

[[plugin]]
name = "posix-shm"
path = "{plugin_dir / 'libshardport_posix_shm.so'}"
required = true
[plugin.config]
pool-size = "64MiB"
segment-prefix = "{prefix}"

[[plugin]]
name = "http"
path = "{plugin_dir / 'libshardport_http.so'}"
required = true
[plugin.config]
bind = "127.0.0.1:0"
"""


#: The consumer's experiment: every fetch draws an arm (so both transports
#: serve some), a ramp (so its step series exists), a guardrail that does
#: not trip on this little traffic.
EXPERIMENT = {
    "name": "shm-vs-http",
    "unit": "fetch",
    "arms": [
        {"name": "control", "transport": "posix-shm", "weight": 50},
        {"name": "canary", "transport": "http", "weight": 50},
    ],
    "guardrail": {"max-error-rate": 0.5, "window": "5m", "min-samples": 100000},
    "ramp": {"arm": "canary", "steps": [50], "interval": "1h"},
}


def test_every_series_the_dashboard_and_rules_use_is_served_by_live_nodes(prefix, tmp_path):
    exe = shardport_binary()
    cfg_path = tmp_path / "owner.toml"
    cfg_path.write_text(owner_config(prefix, exe.parent))
    env = dict(os.environ, SHARDPORT_MONITORING_TOKEN=TOKEN)
    owner = subprocess.Popen(
        [str(exe), "serve", "--config", str(cfg_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        lines = []
        while not any(line.startswith("control: ") for line in lines):
            line = owner.stdout.readline()
            assert line, "shardport serve exited before serving:\n" + "".join(lines)
            lines.append(line)
        addr = next(l for l in lines if l.startswith("control: ")).split()[1]

        # The scrape needs the bearer token, as the scrape config in
        # deploy/monitoring.md gives it.
        with pytest.raises(urllib.error.HTTPError) as denied:
            control(addr, "GET", "/metrics", token=None)
        assert denied.value.code == 401

        # Shards of two size buckets, put through the owner's control endpoint.
        handles = []
        for n in (4096, 1 << 20):
            reply = json.loads(control(addr, "POST", "/v1/put", bytes(range(256)) * (n // 256)))
            handles.append(shardport.Handle.from_bytes(bytes.fromhex(reply["handle"])))

        # A refused reload and an applied one (the file read again).
        with pytest.raises(urllib.error.HTTPError) as refused:
            bad = {"config": "[node]\nname = 5\n", "path": "bad.toml"}
            control(addr, "POST", "/v1/reload", json.dumps(bad).encode())
        assert refused.value.code == 409
        control(addr, "POST", "/v1/reload", b"")

        cfg = config(prefix)
        cfg["fetch"]["on-downgrade"] = "allow"
        cfg["experiment"] = [EXPERIMENT]
        rounds = 40
        with shardport.Node(cfg) as consumer:
            for i in range(rounds):
                for h in handles:
                    s = consumer.fetch(h, mode="view" if i % 2 else "copy")
                    assert bytes(s.numpy()[:256]) == bytes(range(256))
                    del s
            held = consumer.fetch(handles[1], mode="view")  # a lease while scraping
            consumer_text = consumer.metrics()
            owner_text = control(addr, "GET", "/metrics").decode()
            consumer_samples = parse_samples(consumer_text)
            owner_samples = parse_samples(owner_text)
            del held
    finally:
        if owner.poll() is None:
            owner.send_signal(signal.SIGTERM)
        rest, _ = owner.communicate(timeout=60)
    assert owner.returncode == 0 and rest.strip().endswith("stopped"), rest

    # The traffic made the series the panels draw, with the right numbers.
    fetched = rounds * len(handles) + 1
    c = consumer_samples
    assert value(c, "shardport_fetches_total") == fetched
    assert value(c, "shardport_fetches_total", transport="posix-shm") > 0
    assert value(c, "shardport_fetches_total", transport="http") > 0
    assert value(c, "shardport_fetch_errors_total") == 0
    assert value(c, "shardport_experiment_assigned_total", experiment="shm-vs-http") == fetched
    assert value(c, "shardport_fetch_latency_seconds_count") == fetched
    assert {ls["size"] for n, ls, _ in c if n == "shardport_fetch_latency_seconds_count"} == {"4KiB", "1MiB"}
    assert value(c, "shardport_plugin_current", transport="posix-shm", stat="leases_active") >= 1
    o = owner_samples
    assert value(o, "shardport_plugin_current", stat="leases_held_on_owner") >= 1
    used = value(o, "shardport_plugin_current", stat="pool_bytes_used")
    assert 0 < used <= value(o, "shardport_plugin_current", stat="pool_bytes_total")
    assert value(o, "shardport_reloads_total", result="refused") == 1
    assert value(o, "shardport_reloads_total", result="applied") == 1
    assert value(o, "shardport_plugin_events_total", transport="http", stat="requests_served") > 0

    # Every name and every fixed label value the dashboard and rules query
    # is served by one of the two nodes.
    served: dict[str, list[dict[str, str]]] = {}
    for n, ls, _ in consumer_samples + owner_samples:
        served.setdefault(n, []).append(ls)
    queries = {"dashboard": dashboard_queries(), "rules": rule_exprs()}
    referenced = set()
    missing = []
    for source, exprs in queries.items():
        for e in exprs:
            for name in metric_names(e) - PROMETHEUS_OWN:
                referenced.add(name)
                if name not in served:
                    missing.append(f"{source}: {name} in {e}")
            for metric, label, values in fixed_matchers(e):
                if metric in PROMETHEUS_OWN:
                    continue
                have = {ls.get(label) for ls in served.get(metric, [])}
                for v in values:
                    if v not in have:
                        missing.append(f'{source}: {metric}{{{label}="{v}"}} in {e}')
    assert not missing, "not served by a live node:\n" + "\n".join(missing)
    # Prometheus' own linter accepts both scrapes as they are (names, types,
    # units, help), where it is installed.
    promtool = _promtool()
    if promtool is not None:
        for text in (consumer_text, owner_text):
            out = subprocess.run(
                [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
            )
            assert out.returncode == 0 and not (out.stdout + out.stderr).strip(), out.stdout + out.stderr
    # The extractor saw the queries (an empty set would pass the check above).
    assert {
        "shardport_fetch_latency_seconds_bucket",
        "shardport_experiment_latency_seconds_bucket",
        "shardport_experiment_arm_state",
        "shardport_plugin_current",
        "shardport_reloads_total",
    } <= referenced, sorted(referenced)
