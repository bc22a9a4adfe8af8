"""Scheduler core: branches, the round scheduler, policies and measures (engine-agnostic)."""
