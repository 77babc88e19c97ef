"""Integrations of flashtile with other libraries (imported on demand)."""
