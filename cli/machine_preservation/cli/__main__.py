"""`python -m machine_preservation.cli` runs the command line."""

from machine_preservation.cli.main import main

main()
