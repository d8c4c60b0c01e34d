"""Widgets shared by the screens; one per file."""
