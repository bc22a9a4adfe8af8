"""Hybrid prefix cache: page and slot pools, the radix index with state snapshots."""
