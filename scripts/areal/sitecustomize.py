"""Switches AReaL's RTensor backend to shardport's in every Python process
that starts with this directory on ``PYTHONPATH`` and
``SHARDPORT_AREAL_BACKEND=1``: the test process and the RPC servers it
starts (scripts/areal-suite.sh). One constructor, as a job would switch."""

import os
import sys

if os.environ.get("SHARDPORT_AREAL_BACKEND") == "1":
    try:
        from areal.infra.rpc import rtensor
        from shardport.areal import ShardportRTensorBackend

        rtensor.set_backend(ShardportRTensorBackend())
    except Exception as e:  # a broken switch must not pass as a stock run
        print(f"areal-suite: cannot switch AReaL's backend to shardport: {e}", file=sys.stderr)
        raise
