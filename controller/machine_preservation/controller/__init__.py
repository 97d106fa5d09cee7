"""The controller shell: informers, work queues, step executors, drain, leader election, metrics.

Modelled on controller-runtime: level-based reconcilers read from watch caches, ask the pure core
(`machine_preservation.core`) for a plan, and execute it as ordered idempotent API writes; every
failure requeues the key with backoff. Nothing is remembered outside the API objects except caches.
Never imports the webhook package (tests/unit/test_layering.py).
"""
