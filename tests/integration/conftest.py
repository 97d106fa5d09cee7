"""The integration tests' shared fixtures: the controller tests' (tests/controller/support.py) and the seed's
system parts (tests/integration/seed_system.py)."""

from tests.controller.support import api, node_names
from tests.integration.seed_system import seed_system

__all__ = ["api", "node_names", "seed_system"]
