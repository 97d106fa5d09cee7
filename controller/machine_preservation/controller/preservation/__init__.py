"""One namespace's preservation lifecycle: MCM's objects in a control namespace and the Nodes and Pods of its target
cluster, read from caches, turned into the core's plans and written back. `runtime.ShootRuntime` runs it; the
standalone controller runs one, the Gardener extension one per shoot."""
