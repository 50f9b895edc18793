import multiprocessing as mp

import pytest

import shardport

from helpers import config, leftovers, unique_prefix


@pytest.fixture
def prefix():
    p = unique_prefix()
    yield p
    assert leftovers(p) == [], "segments left in /dev/shm"


@pytest.fixture
def node(prefix):
    with shardport.Node(config(prefix)) as n:
        yield n


@pytest.fixture
def spawn():
    return mp.get_context("spawn")
