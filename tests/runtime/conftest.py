"""Fixtures shared with tests/e2e (tiny random models and a small dataset)."""
from tests.e2e.conftest import tiny_assets  # noqa: F401  (re-exported as a fixture)
