"""Certificates: CA and leaf generation, loading, expiry and rotation decisions (cryptography only)."""
