"""Certificates for the webhook: generation, validation, rotation and caBundle injection.

Pure (cryptography only, `now` passed in): `authority` (CA and certificates), `pairs` (loading and
validating PEM material), `bundle` (caBundle composition and webhook-configuration patches), `rotation`
(when to rotate, and the state after). I/O only in `manager` (Secret, cert dir, API writes with
kubernetes.aio) and `commands` (`machine-preservation certs run`).
"""
