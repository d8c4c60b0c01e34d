"""Benchmarks: programs that print a table with the peer measured in the same run and the ratio."""
