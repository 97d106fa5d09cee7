"""`python -m machine_preservation.localcluster up|down`."""

from machine_preservation.localcluster.commands import main

main()
