"""Benchmarks of rayorch against Ray Data, Daft and the lower bound."""
