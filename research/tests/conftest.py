"""The product's test fixtures (tests/conftest.py), for the research's tests too: the
session's isolated user cards and load cache among them."""

from tests.conftest import load_cache_folder, user_cards  # noqa: F401
