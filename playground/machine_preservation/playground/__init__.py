"""`python -m machine_preservation.playground`: the product working end to end on a local control plane."""
