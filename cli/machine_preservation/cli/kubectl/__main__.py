"""`python -m machine_preservation.cli.kubectl` runs the plugin, as `kubectl-preservation` does."""

from machine_preservation.cli.kubectl.plugin import main

main()
