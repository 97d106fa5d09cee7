"""The shared, I/O-free core: vocabulary, object models and decisions.

Nothing in this package performs I/O or imports aiohttp, the kubernetes client, sockets or ssl;
`lint-imports` enforces that (the contract "The core decides and does no I/O" in pyproject.toml).
"""
