"""Adapters that run radixflow's scheduling rules inside other serving engines."""
