"""The machinery every controller process is built from, with no knowledge of Gardener or of a reconcile: the
work queue and its workers, leader election, metrics and health, Kubernetes Events, the reconcile slots shared by a
process, and the garbage-collector settings of a process that holds a seed's caches."""
