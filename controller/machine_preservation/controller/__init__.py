"""The controller shell: informers, work queues, step executors, drain, leader election, metrics.

Modelled on controller-runtime: level-based reconcilers read from watch caches, ask the pure core
(`machine_preservation.core`) for a plan, and execute it as ordered idempotent API writes; every
failure requeues the key with backoff. Nothing is remembered outside the API objects except caches.

The subpackages, each importing only those listed after it (the import contracts in pyproject.toml):
- `standalone` and `gardener`: the two processes. `standalone` runs one namespace's preservation; `gardener` is the
  seed-wide extension (Gardener's Extension contract, the shoots' access and lifecycles, the seed-wide watches);
- `preservation`: one namespace's preservation lifecycle (caches, handlers, reconciles, writes, drain, the runtime);
- `machinery`: what both are built from (the work queue, leader election, metrics, Events, slots, the heap).

One way through a preservation: informer (a watch event) -> handlers (the keys it affects) -> queue (a worker takes a
key) -> reconcile (the core's plan) -> apply (the API writes).
"""
