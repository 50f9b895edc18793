"""A library node's control endpoint (``Node.serve_control``) and
``shardport.remove_remote``: another process removes the owner's shards
with the token, never without it, and bad input is refused before any
request. Real nodes, a real HTTP endpoint, a real second process."""

import numpy as np
import pytest

import shardport
from helpers import in_child

TOKEN = "s3cret-token"


def child_remove(address: str, ids: list, token, out) -> None:
    """Child process: ask the owner's endpoint to remove ``ids``; report
    the ids it did not own, or the exception's class name and message."""
    import shardport

    try:
        out.put(("ok", shardport.remove_remote(address, ids, token=token)))
    except shardport.ShardportError as e:
        out.put((type(e).__name__, str(e)))


def test_another_process_removes_the_owners_shards_with_the_token(node, spawn):
    address = node.serve_control(token=TOKEN)
    assert node.control_address == address
    assert node.serve_control() == address, "a second call keeps the endpoint"
    host, port = address.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0, "the library config: loopback, ephemeral"
    a = node.put(np.arange(1024, dtype=np.float32))
    b = node.put(np.ones(16, dtype=np.uint8))
    assert node.stats()["shards_owned"] == 2

    # Without the token, or with another: refused, nothing removed.
    for token in (None, "wrong"):
        kind, message = in_child(spawn, child_remove, address, [str(a.id)], token)
        assert kind == "PermissionDeniedError", (kind, message)
        assert "401" in message, message
    assert node.stats()["shards_owned"] == 2

    kind, missing = in_child(spawn, child_remove, address, [str(a.id)], TOKEN)
    assert (kind, missing) == ("ok", []), missing
    assert node.stats()["shards_owned"] == 1
    with pytest.raises(shardport.NotFoundError):
        node.fetch(a)
    # Removed already: reported missing, the other shard stays.
    kind, missing = in_child(spawn, child_remove, address, [str(a.id)], TOKEN)
    assert (kind, missing) == ("ok", [str(a.id)])
    assert np.asarray(node.fetch(b, mode="copy")).sum() == 16


def test_handles_and_ids_are_both_accepted_and_bad_ids_refused(node):
    address = node.serve_control(token=TOKEN)
    h = node.put(np.zeros(8, dtype=np.int64))
    with pytest.raises(shardport.InvalidInputError, match="32 hex digits"):
        shardport.remove_remote(address, ["not-an-id"], token=TOKEN)
    with pytest.raises(shardport.InvalidInputError, match="Handles or 32-hex-digit"):
        shardport.remove_remote(address, [42], token=TOKEN)
    with pytest.raises(shardport.InvalidInputError, match="timeout"):
        shardport.remove_remote(address, [h], token=TOKEN, timeout=0)
    assert node.stats()["shards_owned"] == 1, "nothing was sent"
    assert shardport.remove_remote(address, [h], token=TOKEN) == []
    assert node.stats()["shards_owned"] == 0


def test_a_closed_or_absent_endpoint_is_a_transport_error(prefix):
    from helpers import config

    n = shardport.Node(config(prefix))
    address = n.serve_control(token=TOKEN)
    h = n.put(np.zeros(4, dtype=np.uint8))
    n.close()
    assert n.control_address is None
    with pytest.raises(shardport.TransportError, match=address):
        shardport.remove_remote(address, [h], token=TOKEN, timeout=2.0)
    with pytest.raises(shardport.ClosedError):
        n.serve_control()


def test_an_empty_token_is_refused(node):
    with pytest.raises(shardport.InvalidInputError, match="token"):
        node.serve_control(token="")
    assert node.control_address is None
