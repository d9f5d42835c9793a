"""Fixtures shared with tests/e2e (tiny random models and a small dataset, a Ray session per module)."""
from tests.e2e.conftest import ray_session, tiny_assets  # noqa: F401  (re-exported as fixtures)
