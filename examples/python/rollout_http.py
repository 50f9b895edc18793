#!/usr/bin/env python3
"""The rollout example across two nodes on loopback, the http transport
chosen by config (the trainer exports through http only): what a rollout
worker on another machine does. Same as `rollout.py --http`."""

import sys

from rollout import main

if __name__ == "__main__":
    sys.exit(main(["--http", *sys.argv[1:]]))
