"""Shared helpers for surogate's tests (on sys.path through pytest's `pythonpath`)."""
