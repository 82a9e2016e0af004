"""Benchmarks: ``python -m bench`` (or ``make bench``) writes docs/benchmarks.md."""
