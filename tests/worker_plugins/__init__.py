"""Plugins for the warm worker tests (imported from tests/, not installed)."""
