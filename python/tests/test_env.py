"""shardport.env: a node's address and name from the engine's environment
(Ray, torchrun, Kubernetes), with monkeypatched environments."""

import warnings

import numpy as np
import pytest

import shardport
from shardport import env as spenv
from shardport.errors import ConfigError, InvalidInputError, ShardportError

from helpers import config

ENGINE_VARS = [
    "SHARDPORT_ADDR_FROM",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
    "POD_IP",
    "POD_NAME",
    "NODE_NAME",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No engine variable of the machine running the tests leaks in."""
    for v in ENGINE_VARS:
        monkeypatch.delenv(v, raising=False)


def http_config(cfg: dict) -> dict:
    return next(p for p in cfg["plugin"] if p["name"] == "http")["config"]


def test_the_default_is_none_and_leaves_the_config_as_given(monkeypatch):
    monkeypatch.setenv("POD_IP", "10.1.2.3")  # present, but not opted in
    assert spenv.DEFAULT_SOURCE == "none"
    assert spenv.detect() == spenv.EngineEnv(source="none")
    cfg = shardport.default_config()
    assert spenv.apply(cfg) is cfg
    assert spenv.apply(None) is None


@pytest.mark.parametrize("value", ["kube", "", "ray,k8s", "RAY "])
def test_a_bad_selector_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("SHARDPORT_ADDR_FROM", value)
    if value.strip().lower() == "ray":  # case and spaces are forgiven
        with pytest.raises(InvalidInputError, match="Ray is not initialized"):
            spenv.detect()
        return
    with pytest.raises(InvalidInputError, match="SHARDPORT_ADDR_FROM: expected one of auto, ray"):
        spenv.detect()


def test_a_bad_argument_names_the_argument():
    with pytest.raises(InvalidInputError, match="addr_from: expected one of"):
        spenv.detect("torch")
    with pytest.raises(ShardportError):  # the package's one hierarchy
        shardport.Node(None, addr_from="slurm")


def test_the_argument_wins_over_the_variable(monkeypatch):
    monkeypatch.setenv("SHARDPORT_ADDR_FROM", "k8s")
    assert spenv.detect("none").source == "none"


def test_k8s_downward_api(monkeypatch):
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    monkeypatch.setenv("POD_NAME", "trainer-0")
    monkeypatch.setenv("NODE_NAME", "gpu-node-7")
    e = spenv.detect("k8s")
    assert (e.source, e.host, e.name, e.pod_name, e.node_name) == (
        "k8s",
        "10.1.2.3",
        "trainer-0",
        "trainer-0",
        "gpu-node-7",
    )
    cfg = shardport.default_config()
    http_config(cfg)["auth-token-env"] = "SHARDPORT_TOKEN"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a token is set: no warning
        out = e.overrides(cfg)
    assert out["node"]["name"] == "trainer-0"
    assert out["node"]["advertise"] == "10.1.2.3:0"  # the configured port kept
    assert http_config(out)["bind"] == "10.1.2.3:0"
    assert http_config(cfg)["bind"] == "127.0.0.1:0"  # the input is not modified


def test_k8s_without_a_token_warns(monkeypatch):
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    with pytest.warns(spenv.ExposedWithoutTokenWarning, match="auth-token-env"):
        out = spenv.apply(None, "k8s")
    assert out["node"]["name"] == "pod-10.1.2.3"


def test_k8s_ipv6_and_an_unspecified_bind(monkeypatch):
    monkeypatch.setenv("POD_IP", "fd00::5")
    cfg = shardport.default_config()
    http_config(cfg).update({"bind": "0.0.0.0:7071", "auth-token": "t" * 32})
    out = spenv.apply(cfg, "k8s")
    assert out["node"]["advertise"] == "[fd00::5]:0"  # the config's port kept
    assert http_config(out)["bind"] == "0.0.0.0:7071"  # kept: serves every interface
    assert http_config(out)["advertise"] == "fd00::5"  # reached at the pod IP


@pytest.mark.parametrize(
    "var, value, match",
    [
        ("POD_IP", None, "POD_IP is not set"),
        ("POD_IP", "", "POD_IP is not set"),
        ("POD_IP", "10.1.2", "environment variable POD_IP: expected an IP address"),
        ("POD_IP", "$(POD_IP)", "environment variable POD_IP: expected an IP address"),
        ("POD_NAME", "two words", "POD_NAME='two words' is not a Kubernetes name"),
        ("NODE_NAME", "x" * 300, "NODE_NAME="),
    ],
)
def test_k8s_bad_values_name_the_variable(monkeypatch, var, value, match):
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    if value is None:
        monkeypatch.delenv(var)
    else:
        monkeypatch.setenv(var, value)
    with pytest.raises(InvalidInputError, match=match):
        spenv.detect("k8s")


def torchrun_env(monkeypatch, **kv):
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "1", "WORLD_SIZE": "2"}
    base.update(kv)
    for k, v in base.items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)


def test_torchrun_ranks_and_a_loopback_master(monkeypatch):
    torchrun_env(monkeypatch, MASTER_ADDR="localhost", LOCAL_RANK="1", GROUP_RANK="0")
    e = spenv.detect("torchrun")
    assert (e.rank, e.local_rank, e.world_size, e.group_rank) == (1, 1, 2, 0)
    assert e.host in ("127.0.0.1", "::1") and e.name == "rank1"
    cfg = shardport.default_config()
    out = e.overrides(cfg)
    assert out["node"]["advertise"] in ("127.0.0.1:0", "[::1]:0")
    assert http_config(out)["bind"] == "127.0.0.1:0"  # loopback stays loopback


@pytest.mark.parametrize(
    "kv, match",
    [
        ({"MASTER_ADDR": None}, "MASTER_ADDR is not set"),
        ({"RANK": None}, "RANK is not set"),
        ({"RANK": "one"}, "RANK='one' is not an integer"),
        ({"RANK": "-1"}, "RANK=-1 must be >= 0"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be >= 1"),
        ({"RANK": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
        ({"LOCAL_RANK": "1.5"}, "LOCAL_RANK='1.5' is not an integer"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 must be in 0..=65535"),
        ({"MASTER_ADDR": "no-such-host.invalid"}, "MASTER_ADDR='no-such-host.invalid' does not resolve"),
    ],
)
def test_torchrun_bad_values_name_the_variable(monkeypatch, kv, match):
    torchrun_env(monkeypatch, **kv)
    with pytest.raises(InvalidInputError, match=match):
        spenv.detect("torchrun")


def test_auto_picks_the_engine_that_applies(monkeypatch):
    assert spenv.detect("auto").source == "none"
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    assert spenv.detect("auto").source == "k8s"
    torchrun_env(monkeypatch)  # torchrun inside a pod: torchrun's ranks name it
    assert spenv.detect("auto").source == "torchrun"
    monkeypatch.setenv("SHARDPORT_ADDR_FROM", "auto")
    assert spenv.detect().source == "torchrun"


def test_ray_not_initialized_is_a_clear_error():
    with pytest.raises(InvalidInputError, match="Ray is not initialized in this process"):
        spenv.detect("ray")


def test_a_node_takes_its_name_and_address_from_the_environment(monkeypatch, prefix):
    monkeypatch.setenv("SHARDPORT_ADDR_FROM", "k8s")
    monkeypatch.setenv("POD_IP", "127.0.0.1")  # loopback: nothing is exposed here
    monkeypatch.setenv("POD_NAME", "rollout-1")
    with shardport.Node(config(prefix)) as node:
        assert node.name == "rollout-1"
        h = node.put(np.arange(3, dtype=np.int32))
        assert h.owner == "127.0.0.1:0"
        assert np.asarray(node.fetch(h)).tolist() == [0, 1, 2]


def test_config_from_a_file_and_from_text(monkeypatch, tmp_path):
    monkeypatch.setenv("POD_IP", "10.9.8.7")
    f = tmp_path / "node.toml"
    f.write_text(
        '[node]\nadvertise = "0.0.0.0:9"\n[[plugin]]\nname = "http"\npath = "x.so"\n'
        '[plugin.config]\nauth-token-env = "T"\n'
    )
    (tmp_path / "x.so").write_bytes(b"")
    out = spenv.apply(f, "k8s")
    assert out["node"]["advertise"] == "10.9.8.7:9"
    assert out["plugin"][0]["path"] == str(tmp_path / "x.so")  # relative to the file
    assert spenv.apply(f.read_text(), "k8s")["plugin"][0]["path"] == "x.so"
    with pytest.raises(ConfigError, match="not valid TOML"):
        spenv.apply("[node\n", "k8s")
    with pytest.raises(ConfigError, match="node.advertise"):
        spenv.apply({"node": {"advertise": "nohostport"}}, "k8s")
    with pytest.raises(ConfigError, match="cannot read config file /no/such.toml"):
        spenv.apply("/no/such.toml", "k8s")
    with pytest.raises(InvalidInputError, match="found int"):
        spenv.apply(3, "k8s")


NODE_TOML = """[node]
advertise = "127.0.0.1:0"

[[plugin]]
name = "posix-shm"
path = "libshardport_posix_shm.so"

[plugin.config]
segment-prefix = "{prefix}"
pool-size = "64MiB"
"""


def test_a_node_with_overrides_reloads_its_own_file(monkeypatch, prefix, tmp_path):
    # The core applies the overrides at start and at every reload: the file
    # stays a file (errors point into it) and reading it again changes nothing.
    monkeypatch.setenv("POD_IP", "127.0.0.1")
    monkeypatch.setenv("POD_NAME", "rollout-1")
    f = tmp_path / "node.toml"
    f.write_text(NODE_TOML.format(prefix=prefix))
    with shardport.Node(str(f), addr_from="k8s") as node:
        assert node.name == "rollout-1"
        h = node.put(np.arange(3, dtype=np.int32))
        report = node.reload()
        assert (report["generation"], report["changes"]) == (1, [])
        assert node.name == "rollout-1" and node.address == "127.0.0.1:0"
        f.write_text(NODE_TOML.format(prefix=prefix) + '\n[fetch]\nmode = "sideways"\n')
        with pytest.raises(ConfigError, match=f"--> {f}:13:8"):
            node.reload()
        assert node.stats()["generation"] == 1
        assert np.asarray(node.fetch(h)).tolist() == [0, 1, 2]


def test_a_config_string_is_a_file_or_text_by_the_hosts_rule(prefix, tmp_path):
    f = tmp_path / "node.toml"
    f.write_text(NODE_TOML.format(prefix=prefix))
    for given in (str(f), f, f.read_text()):
        with shardport.Node(given) as node:
            assert node.transports == ["posix-shm"]
    with pytest.raises(ConfigError, match="cannot read config file /no/such.toml"):
        shardport.Node("/no/such.toml")
    with pytest.raises(ConfigError, match="--> <config string>:1:6"):
        shardport.Node("[node\n")
