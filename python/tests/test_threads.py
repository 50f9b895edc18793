"""put and fetch release the GIL: Python threads really run at once."""

import sys
import threading

import numpy as np


def test_threads_interleave_while_the_gil_is_released(node):
    # With a huge switch interval the interpreter never preempts a thread:
    # the other thread runs only when one releases the GIL voluntarily. If
    # put/fetch held it, each thread's iterations would run as one block.
    hs = [node.put(np.full(1 << 20, i, dtype=np.uint8)) for i in range(4)]
    events = []
    start = threading.Barrier(2)

    def work(tag):
        start.wait()
        for i in range(40):
            s = node.fetch(hs[i % 4], mode="copy")
            node.remove(node.put(np.asarray(s)))
            events.append(tag)

    old = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        ts = [threading.Thread(target=work, args=(t,)) for t in "ab"]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        sys.setswitchinterval(old)
    switches = sum(1 for x, y in zip(events, events[1:]) if x != y)
    assert len(events) == 80
    assert switches > 2, f"threads ran one after the other: {''.join(events)}"


def test_concurrent_fetches_are_consistent(node):
    arrays = [np.random.default_rng(i).integers(0, 1 << 30, 50_000) for i in range(8)]
    hs = [node.put(a) for a in arrays]
    errors = []

    def work(k):
        try:
            for i in range(20):
                j = (i + k) % 8
                assert np.array_equal(np.asarray(node.fetch(hs[j])), arrays[j])
        except AssertionError as e:
            errors.append(e)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
