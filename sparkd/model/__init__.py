"""Frozen value types: what is observed, what is remembered, what is planned."""
