"""The controller tests' shared fixtures, defined once in tests/controller/support.py."""

from tests.controller.support import api, node_names

__all__ = ["api", "node_names"]
