"""`kubectl preservation`: the kubectl plugin an SRE reaches for first (console script `kubectl-preservation`).

Pure parts: `outcomes` (errors and their exit codes), `view` (rows, times, sorting, the documented JSON/YAML
structure, tables) and `evidence_view` (the failure's evidence as text). Thin shells: `api` (the requests, with
the blocking kubernetes client) and `plugin` (the command line).
"""
