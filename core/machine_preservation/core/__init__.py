"""The shared, I/O-free core: vocabulary, object models and decisions.

Nothing in this package performs I/O or imports aiohttp, the kubernetes client, sockets or ssl;
tests/unit/test_layering.py enforces that.
"""
