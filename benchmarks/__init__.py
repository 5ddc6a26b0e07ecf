"""Benchmarks: each script compares against its baseline in one run and writes a table, JSON and a PNG."""
