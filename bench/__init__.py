"""Benchmarks, the demo and the test harness (local clusters on loopback, the WAN proxy, chaos, fuzz, soak).

Not part of the installed package: they run from a source checkout (`edgespec bench ...` finds them there).
"""
