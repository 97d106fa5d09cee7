"""The `machine-preservation` command line: the image's one entry point, one subcommand per component."""
