"""Benchmarks over ConfQuestions-shaped data (read in place from ../shared; never copied)."""
