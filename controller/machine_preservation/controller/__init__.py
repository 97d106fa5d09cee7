"""The controller shell: informers, work queues, step executors, drain, leader election, metrics.

Modelled on controller-runtime: level-based reconcilers read from watch caches, ask the pure core
(`machine_preservation.core`) for a plan, and execute it as ordered idempotent API writes; every
failure requeues the key with backoff. Nothing is remembered outside the API objects except caches.

One way through: informer (a watch event) -> handlers (the keys it affects) -> queue (a worker takes a key)
-> reconcile (the core's plan) -> apply (the API writes). The modules form layers in that order, each importing
only those below it; the import contracts in pyproject.toml enforce that, and that the package never imports
the webhook's.
"""
