"""What the Rust core says reaches Python: log records in ``logging``,
warnings for downgrades and unknown config keys, plugin option errors as
``ConfigError`` at the key's file:line:col (required and optional plugins
alike)."""

import logging
import warnings

import numpy as np
import pytest
import shardport
from helpers import config


def _records(caplog, name):
    return [r for r in caplog.records if r.name == name]


def test_rust_records_reach_logging_with_the_plugin_named(caplog, prefix):
    caplog.set_level(logging.DEBUG, logger="shardport")
    with shardport.Node(config(prefix)) as node:
        node.put(np.arange(4, dtype=np.int32))
    shardport.flush_logs()
    loaded = [r for r in _records(caplog, "shardport.loader") if "plugin loaded" in r.getMessage()]
    assert len(loaded) >= 2 and all(r.levelno == logging.INFO for r in loaded)
    # A plugin's own record: its name in the record and before the message.
    exported = [
        r
        for r in _records(caplog, "shardport.plugin")
        if getattr(r, "plugin", None) == "posix-shm" and "exported" in r.getMessage()
    ]
    assert exported, [r.getMessage() for r in caplog.records]
    assert exported[0].levelno == logging.DEBUG
    assert exported[0].getMessage().startswith("[posix-shm] exported")
    assert exported[0].source == "posix_shm"


def test_records_below_the_logger_level_are_not_forwarded(caplog, prefix):
    caplog.set_level(logging.WARNING, logger="shardport")
    with shardport.Node(config(prefix)) as node:
        node.put(np.arange(4, dtype=np.int32))
    shardport.flush_logs()
    assert not [r for r in caplog.records if r.name.startswith("shardport.") and r.levelno < logging.WARNING]


def test_an_unknown_key_is_a_config_warning_at_its_line(tmp_path, prefix):
    text = shardport.DEFAULT_CONFIG.replace("[fetch]\n", '[fetch]\nmdoe = "copy"\n').replace(
        'pool-size = "768MiB"', f'pool-size = "16MiB"\nsegment-prefix = "{prefix}"'
    ) + '\n[fecth]\nmode = "copy"\n'
    p = tmp_path / "node.toml"
    p.write_text(text)
    lines = text.splitlines()
    mdoe = lines.index('mdoe = "copy"') + 1
    fecth = lines.index("[fecth]") + 1
    with pytest.warns(shardport.ConfigWarning) as got:
        node = shardport.Node(p)
    node.close()
    messages = [str(w.message) for w in got]
    assert f"unknown config key `fetch.mdoe` (ignored) at {p}:{mdoe}:1" in messages, messages
    assert f"unknown config key `fecth` (ignored) at {p}:{fecth}:2" in messages, messages
    # Warnings are ordinary Python warnings: a filter can make them errors.
    with warnings.catch_warnings():
        warnings.simplefilter("error", shardport.ConfigWarning)
        with pytest.raises(shardport.ConfigWarning, match="fetch.mdoe"):
            shardport.Node(p)


@pytest.mark.parametrize("required", [True, False])
def test_a_refused_plugin_option_is_a_config_error_at_its_line(tmp_path, prefix, required):
    text = shardport.DEFAULT_CONFIG.replace(
        'pool-size = "768MiB"', f'pool-size = "16MiB"\nsegment-prefix = "{prefix}"'
    )
    # The http plugin's table (the control table above it has a `bind` too).
    head, http = text.split('path = "libshardport_http.so"\n', 1)
    http = http.replace(
        'bind = "127.0.0.1:0"',
        'bind = "127.0.0.1:0"\ntls-cert = "/nonexistent/cert.pem"\ntls-key = "/nonexistent/key.pem"',
        1,
    )
    text = head + f'path = "libshardport_http.so"\nrequired = {str(required).lower()}\n' + http
    p = tmp_path / "node.toml"
    p.write_text(text)
    line = text.splitlines().index('tls-cert = "/nonexistent/cert.pem"') + 1
    with pytest.raises(shardport.ConfigError) as e:
        shardport.Node(p)
    msg = str(e.value)
    assert "plugin `http` refused its config: `plugin.http.config.tls-cert`" in msg, msg
    assert f"{p}:{line}:1" in msg, msg


def test_a_view_served_as_a_copy_warns_and_allow_silences_it(prefix):
    with shardport.Node(config(prefix)) as node:
        # The config's `network` route sends tagged shards through http.
        h = node.put(np.arange(8, dtype=np.int64), tags={"path": "network"})
        with pytest.warns(shardport.DowngradeWarning, match="a view was asked and `http` served a copy"):
            s = node.fetch(h, mode="view")
        assert s.transport == "http" and s.mode == "copy"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            node.fetch(h, mode="copy")  # a copy asked: nothing to say
    cfg = config(prefix)
    cfg["fetch"]["on-downgrade"] = "allow"
    with shardport.Node(cfg) as node:
        h = node.put(np.arange(8, dtype=np.int64), tags={"path": "network"})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert node.fetch(h, mode="view").transport == "http"


def test_a_failed_faster_transport_is_a_downgrade_warning_and_logged(caplog, prefix):
    cfg = config(prefix)
    shm = next(p for p in cfg["plugin"] if p["name"] == "posix-shm")
    # Every posix-shm import fails midway: http serves instead.
    shm["faults"] = {"seed": 1, "reset": 1.0}
    with shardport.Node(cfg) as node:
        h = node.put(np.arange(8, dtype=np.int64))
        with pytest.warns(shardport.DowngradeWarning, match="`http` served it after posix-shm failed"):
            s = node.fetch(h, mode="copy")
        assert s.transport == "http" and s.downgraded
        assert np.asarray(s).tolist() == list(range(8))
    shardport.flush_logs()
    assert any(
        r.name == "shardport.select" and "downgrade" in r.getMessage() and r.levelno == logging.WARNING
        for r in caplog.records
    )


def test_a_logging_handler_that_calls_shardport_does_not_recurse(prefix):
    """A handler may call shardport; its records wait for the next forward
    instead of being forwarded inside this one."""
    logger = logging.getLogger("shardport")
    seen = []
    depth = [0, 0]  # now, deepest

    with shardport.Node(config(prefix)) as node:
        h = node.put(np.arange(4, dtype=np.int32))

        class CallsBack(logging.Handler):
            def emit(self, record):
                depth[0] += 1
                depth[1] = max(depth)
                try:
                    seen.append(record.getMessage())
                    node.fetch(h, mode="copy")  # logs more while forwarding
                finally:
                    depth[0] -= 1

        handler = CallsBack(level=logging.DEBUG)
        logger.addHandler(handler)
        old = logger.level
        logger.setLevel(logging.DEBUG)
        try:
            shardport.flush_logs()
            for _ in range(20):
                node.fetch(h, mode="copy")
            shardport.flush_logs()
        finally:
            logger.removeHandler(handler)
            logger.setLevel(old)
            shardport.flush_logs()
    assert any("fetched" in m for m in seen), seen[:5]
    assert depth[1] == 1, f"records were forwarded inside a forward (depth {depth[1]})"
