"""The only skips the suite allows: what this machine's kernel cannot do. Any other skip
fails the run (`tests/conftest.py`), so a missing fixture, tool or directory can never pass
quietly: a test that needs one fails and says what to install.

Each entry is a test's node id and why it may skip; `tests/unit/test_self_contained.py`
checks that each names a test that exists.
"""

from __future__ import annotations

ALLOWED = {
    "tests/integration/network_manager/test_node_networks.py::"
    "test_ipvlan_links_where_the_kernel_has_the_driver": (
        "the kernel has no ipvlan driver (EOPNOTSUPP); the refusal half of the test still runs"
    ),
}
"""Node id -> the reason that test may skip."""
