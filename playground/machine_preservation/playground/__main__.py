"""`python -m machine_preservation.playground`."""

from machine_preservation.playground.commands import main

main()
