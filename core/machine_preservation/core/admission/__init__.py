"""Admission decisions: pure functions from an admission request's objects to a verdict.

The webhook shell (machine_preservation.webhook) parses the wire format, reads the few objects a
decision needs, and renders the verdicts; everything decided here is I/O-free and tested as tables.
"""
