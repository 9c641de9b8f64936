"""Helpers the test tiers share: import them from here, never from another tier's conftest or
test module."""
