"""deploy/k8s/: the manifests parse, agree with the shardport config in their
ConfigMap (volumes, env, ports, token, scrape annotations), the config is one
a node accepts, and the pods' program (examples/python/k8s_step.py) runs a
step with that config and the environment the manifests give. Never run on a
cluster here; `kubectl apply --dry-run=client` runs where kubectl exists."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import shardport

from helpers import config, leftovers, unique_prefix

yaml = pytest.importorskip("yaml", reason="PyYAML is not importable (scripts/setup.sh installs it)")

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
STEP = ROOT / "examples" / "python" / "k8s_step.py"
MANIFESTS = ["configmap.yaml", "secret.yaml", "two-pods.yaml", "colocated.yaml", "networkpolicy.yaml"]


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def one(kind: str, name: str) -> dict:
    for f in MANIFESTS:
        for d in docs(f):
            if d["kind"] == kind and d["metadata"]["name"] == name:
                return d
    raise AssertionError(f"no {kind} {name} in {MANIFESTS}")


def config_text() -> str:
    return one("ConfigMap", "shardport-config")["data"]["shardport.toml"]


def toml_config() -> dict:
    return tomllib.loads(config_text())


def plugin(cfg: dict, name: str) -> dict:
    return next(p for p in cfg["plugin"] if p["name"] == name)


def port_of(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1])


def byte_size(s: str) -> int:
    m = re.fullmatch(r"(\d+)\s*(Ki|Mi|Gi|KiB|MiB|GiB)?", s)
    assert m, s
    unit = (m.group(2) or "").removesuffix("B")
    return int(m.group(1)) << {"": 0, "Ki": 10, "Mi": 20, "Gi": 30}[unit]


def pod_templates() -> list[tuple[str, dict]]:
    out = []
    for f in ("two-pods.yaml", "colocated.yaml"):
        for d in docs(f):
            if d["kind"] == "Job":
                out.append((d["metadata"]["name"], d["spec"]["template"]))
    return out


def env_of(container: dict) -> dict:
    return {e["name"]: e for e in container.get("env", [])}


def test_every_manifest_parses_and_has_the_expected_objects():
    kinds = {f: [d["kind"] for d in docs(f)] for f in MANIFESTS}
    assert kinds == {
        "configmap.yaml": ["ConfigMap"],
        "secret.yaml": ["Secret"],
        "two-pods.yaml": ["Service", "Job", "Job"],
        "colocated.yaml": ["Job"],
        "networkpolicy.yaml": ["NetworkPolicy"],
    }
    for f in MANIFESTS:
        for d in docs(f):
            assert d["apiVersion"] and d["metadata"]["name"], (f, d)


def test_the_configmap_holds_a_config_a_node_accepts(monkeypatch):
    monkeypatch.setenv("SHARDPORT_TOKEN", "t" * 32)
    monkeypatch.setenv("POD_IP", "127.0.0.1")
    monkeypatch.setenv("POD_NAME", "trainer-abc")
    text = config_text().replace('bind = "127.0.0.1:7071"', 'bind = "127.0.0.1:0"')  # a free port
    with shardport.Node(text, addr_from="k8s") as node:  # the Rust checks run here
        assert node.name == "trainer-abc"
        assert set(node.transports) >= {"posix-shm", "http"}


def test_pods_get_the_environment_volumes_and_ports_the_config_names():
    cfg = toml_config()
    http = plugin(cfg, "http")["config"]
    shm = plugin(cfg, "posix-shm")["config"]
    token_env = http["auth-token-env"]
    secret = one("Secret", "shardport-token")
    assert pod_templates(), "no Job pod templates"
    for job, tpl in pod_templates():
        spec = tpl["spec"]
        vols = {v["name"]: v for v in spec["volumes"]}
        # The config comes from the ConfigMap, at the path the env names.
        assert vols["config"]["configMap"]["name"] == "shardport-config", job
        # /dev/shm is memory-backed and holds the pool.
        dshm = vols["dshm"]["emptyDir"]
        assert dshm["medium"] == "Memory", job
        assert byte_size(dshm["sizeLimit"]) >= byte_size(shm["pool-size"]), job
        ann = tpl["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/path"] == "/metrics"
        scraped = int(ann["prometheus.io/port"])
        container_ports = []
        for c in spec["containers"]:
            where = f"{job}/{c['name']}"
            mounts = {m["name"]: m for m in c["volumeMounts"]}
            assert mounts["dshm"]["mountPath"] == "/dev/shm", where
            env = env_of(c)
            cfg_path = Path(env["SHARDPORT_CONFIG"]["value"])
            assert cfg_path.parent == Path(mounts["config"]["mountPath"]), where
            assert cfg_path.name in one("ConfigMap", "shardport-config")["data"], where
            assert env["SHARDPORT_ADDR_FROM"]["value"] == "k8s", where
            field = {k: v["valueFrom"]["fieldRef"]["fieldPath"] for k, v in env.items() if "fieldRef" in v.get("valueFrom", {})}
            assert field == {"POD_IP": "status.podIP", "POD_NAME": "metadata.name", "NODE_NAME": "spec.nodeName"}, where
            ref = env[token_env]["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret["metadata"]["name"], where
            assert ref["key"] in secret.get("stringData", secret.get("data", {})), where
            # A memory-backed emptyDir counts against the memory limit.
            assert byte_size(c["resources"]["limits"]["memory"]) >= byte_size(dshm["sizeLimit"]), where
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            probe = c["readinessProbe"]["httpGet"]
            assert probe["path"] == "/metrics" and probe["port"] in ports, where
            if "shardport-http" in ports:
                assert ports["shardport-http"] == port_of(http["bind"]), where
            container_ports += list(ports.values())
        assert scraped in container_ports, f"{job}: nothing declares the scraped port {scraped}"
        assert len(container_ports) == len(set(container_ports)), f"{job}: a port declared twice"


def test_two_pods_use_http_and_the_colocated_pod_shares_dev_shm():
    cfg = toml_config()
    assert cfg["locality"]["same-node"] == "both"
    # Two pods: the rollout reaches the trainer's handle port by the Service.
    svc = one("Service", "shardport-trainer")
    trainer = one("Job", "shardport-trainer")["spec"]["template"]
    assert svc["spec"]["selector"].items() <= trainer["metadata"]["labels"].items()
    app_port = next(p for p in svc["spec"]["ports"] if p["name"] == "app")
    rollout = one("Job", "shardport-rollout")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(rollout)["TRAINER_URL"]["value"] == f"http://{svc['metadata']['name']}:{app_port['port']}"
    # One pod: both containers mount the same /dev/shm volume; one PID
    # namespace so either can prove the other's process dead and sweep.
    colo = one("Job", "shardport-colocated")["spec"]["template"]["spec"]
    assert colo["shareProcessNamespace"] is True
    assert [c["name"] for c in colo["containers"]] == ["trainer", "rollout"]
    for c in colo["containers"]:
        assert any(m["name"] == "dshm" for m in c["volumeMounts"])
    assert env_of(colo["containers"][1])["TRAINER_URL"]["value"].startswith("http://127.0.0.1:9000")
    for tpl_spec in (trainer["spec"], colo):
        assert not tpl_spec.get("hostIPC") and not tpl_spec.get("hostNetwork")


def test_the_network_policy_admits_the_job_s_ports_only_from_the_job_and_prometheus():
    cfg = toml_config()
    http_port = port_of(plugin(cfg, "http")["config"]["bind"])
    pol = one("NetworkPolicy", "shardport")["spec"]
    assert pol["policyTypes"] == ["Ingress"]
    for _, tpl in pod_templates():  # it selects every pod of the job
        assert pol["podSelector"]["matchLabels"].items() <= tpl["metadata"]["labels"].items()
    rules = pol["ingress"]
    job_rule = next(r for r in rules if "podSelector" in r["from"][0] and "namespaceSelector" not in r["from"][0])
    assert job_rule["from"][0]["podSelector"]["matchLabels"] == pol["podSelector"]["matchLabels"]
    app_ports = {int(tpl["metadata"]["annotations"]["prometheus.io/port"]) for _, tpl in pod_templates()}
    assert {p["port"] for p in job_rule["ports"]} == {http_port} | app_ports
    # Shard bytes (the http port) are reachable from the job's pods only.
    for r in rules:
        if r is not job_rule:
            assert http_port not in {p["port"] for p in r["ports"]}, r


def local_config(tmp_path: Path, prefix: str, shm: bool) -> Path:
    """The ConfigMap's config for a run on this machine: our segment prefix,
    an ephemeral http port; without shm, the posix-shm plugin is left out
    (a pod that does not share /dev/shm with the owner) and shards are kept
    on the heap."""
    text = config_text()
    text = text.replace('segment-prefix = "shardport"', f'segment-prefix = "{prefix}"')
    text = text.replace('bind = "127.0.0.1:7071"', 'bind = "127.0.0.1:0"')
    assert prefix in text and 'bind = "127.0.0.1:0"' in text
    if not shm:
        blocks = text.split("[[plugin]]")
        text = "[[plugin]]".join(b for b in blocks if 'name = "posix-shm"' not in b)
        text = text.replace('storage = "pool"', 'storage = "heap"').replace('pool-transport = "posix-shm"', "")
    p = tmp_path / ("shm.toml" if shm else "noshm.toml")
    p.write_text(text)
    return p


def run_step(tmp_path: Path, rollout_shm: bool, rollout_token: str) -> tuple[str, str, int, int]:
    prefix = unique_prefix()
    base = {k: v for k, v in os.environ.items() if k not in ("SHARDPORT_ADDR_FROM", "POD_IP")}
    base.update(SHARDPORT_ADDR_FROM="k8s", POD_IP="127.0.0.1", NODE_NAME="node-1")
    tenv = dict(base, POD_NAME="trainer-0", SHARDPORT_TOKEN="s" * 32)
    renv = dict(base, POD_NAME="rollout-0", SHARDPORT_TOKEN=rollout_token)
    cmd = [sys.executable, str(STEP)]
    tr = subprocess.Popen(
        cmd + ["trainer", "--config", str(local_config(tmp_path, prefix, True)),
               "--bind", "127.0.0.1", "--port", "0", "--timeout", "120"],
        env=tenv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        lines = []
        while not any("serving handles on" in l for l in lines):
            line = tr.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        port = lines[-1].rsplit(":", 1)[1].strip()
        ro = subprocess.run(
            cmd + ["rollout", "--config", str(local_config(tmp_path, prefix, rollout_shm)),
                   "--trainer", f"http://127.0.0.1:{port}", "--bind", "127.0.0.1", "--port", "0",
                   "--timeout", "60"],
            env=renv, capture_output=True, text=True, timeout=120,
        )
        rest, _ = tr.communicate(timeout=120)
        assert leftovers(prefix) == []
        return "".join(lines) + rest, ro.stdout + ro.stderr, tr.returncode, ro.returncode
    finally:
        if tr.poll() is None:
            tr.kill()
            tr.wait()
        if leftovers(prefix):  # a killed trainer's: a node with the prefix sweeps them
            with shardport.Node(config(prefix)):
                pass


def test_the_pods_program_runs_a_step_through_shared_memory(tmp_path):
    tout, rout, trc, rrc = run_step(tmp_path, rollout_shm=True, rollout_token="s" * 32)
    assert (trc, rrc) == (0, 0), tout + rout
    assert "trainer trainer-0: 3 arrays put, owner 127.0.0.1:7071" in tout
    assert "rollout rollout-0: 3 arrays checksums match, via posix-shm (view)" in rout
    assert tout.strip().endswith("ok")


def test_without_shared_dev_shm_it_fetches_over_http_with_the_secret_s_token(tmp_path):
    tout, rout, trc, rrc = run_step(tmp_path, rollout_shm=False, rollout_token="s" * 32)
    assert (trc, rrc) == (0, 0), tout + rout
    assert "rollout rollout-0: 3 arrays checksums match, via http (copy)" in rout


def test_a_wrong_token_is_refused(tmp_path):
    tout, rout, trc, rrc = run_step(tmp_path, rollout_shm=False, rollout_token="w" * 32)
    assert rrc == 1 and trc == 1, tout + rout
    assert "rollout rollout-0: fetch failed: TransportError" in rout, rout
    assert "401" in rout or "token" in rout.lower(), rout
    # The trainer heard of it, ended the step and removed its shards.
    assert "report from rollout-0: ok=False" in tout and tout.strip().endswith("FAILED"), tout


def test_sigterm_closes_the_trainer_s_node(tmp_path):
    """Kubernetes stops pods with SIGTERM: the trainer leaves nothing behind."""
    import signal

    prefix = unique_prefix()
    env = dict(os.environ, SHARDPORT_ADDR_FROM="k8s", POD_IP="127.0.0.1", SHARDPORT_TOKEN="s" * 32)
    tr = subprocess.Popen(
        [sys.executable, str(STEP), "trainer", "--config", str(local_config(tmp_path, prefix, True)),
         "--bind", "127.0.0.1", "--port", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        out = []
        while not any("serving handles on" in l for l in out):
            line = tr.stdout.readline()
            assert line, "".join(out)
            out.append(line)
        assert leftovers(prefix), "the trainer's pool should exist while it runs"
        tr.send_signal(signal.SIGTERM)
        assert tr.wait(timeout=60) == 128 + signal.SIGTERM, tr.stdout.read()
        assert leftovers(prefix) == []
    finally:
        if tr.poll() is None:
            tr.kill()
            tr.wait()
        if leftovers(prefix):
            with shardport.Node(config(prefix)):
                pass


def test_kubectl_dry_run_accepts_the_manifests():
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: the manifests are checked by the tests above only")
    # `apply --dry-run=client` still asks a cluster which kinds exist.
    probe = subprocess.run(
        ["kubectl", "version", "--request-timeout=5s"], capture_output=True, text=True, timeout=60
    )
    if probe.returncode != 0:
        pytest.skip("kubectl reaches no cluster, and apply --dry-run=client needs one for kinds")
    r = subprocess.run(
        ["kubectl", "apply", "--dry-run=client", "--validate=false", *(f"-f{K8S / f}" for f in MANIFESTS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
