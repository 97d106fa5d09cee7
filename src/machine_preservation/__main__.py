"""`python -m machine_preservation` runs the command line."""

from machine_preservation.cli import main

main()
