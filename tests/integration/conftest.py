"""The integration tests' shared fixtures: the controller tests' (tests/controller/support.py), the seed's
system parts (tests/integration/seed_system.py) and the certs manager's identity (certs_identity.py)."""

from tests.controller.support import api, node_names
from tests.integration.certs_identity import certs
from tests.integration.seed_system import seed_system

__all__ = ["api", "certs", "node_names", "seed_system"]
