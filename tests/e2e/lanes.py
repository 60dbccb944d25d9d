"""Which e2e lane this process is, and what a lane owns on the shared cluster (docs/testing.md).

A lane is a pytest-xdist worker (`-n N`); a plain pytest run is one lane of its own.
"""

from __future__ import annotations

import os
import zlib

# The xdist worker id (gw0, gw1, ...) when this process is a lane; empty in a plain pytest run.
LANE = os.environ.get("PYTEST_XDIST_WORKER", "")
NAMESPACE_PREFIX = f"e2e-{LANE}-" if LANE else "e2e-"
_LANE_INDEX = int(LANE[2:]) if LANE.startswith("gw") and LANE[2:].isdigit() else 0

# Nodes a test adds for itself get loopback pod networks 127.X.N.0/24 with N from 150 up, clear of the demo
# fleet's. Each of up to six lanes owns 17 values of N, so the nodes of tests running at once never share a pod
# network (two pods with one IP could not both serve); more lanes than six share them again.
TEST_NETWORKS_FROM = 150
MAX_LANES = 6
NETWORKS_PER_LANE = (256 - TEST_NETWORKS_FROM) // MAX_LANES
MAX_TEST_NODES = 5  # per test


def first_test_network(namespace: str) -> int:
    """N of the first node a test in `namespace` adds; its other nodes take the next ones."""
    lane_base = TEST_NETWORKS_FROM + (_LANE_INDEX % MAX_LANES) * NETWORKS_PER_LANE
    return lane_base + zlib.crc32(namespace.encode()) % (NETWORKS_PER_LANE - MAX_TEST_NODES + 1)


# The xdist group of the tests that apply the shipped examples (test_placement, test_steady_state, test_rbac):
# the examples place on every node of a gfx target (the 70B draft example takes two whole MI300X nodes and the
# ngram one both W7900 workstations), so two such tests at once can leave each other's pods Pending.
DEMO_FLEET_EXAMPLES = "demo-fleet-examples"
