"""The admission webhook: aiohttp HTTPS server speaking AdmissionReview admission.k8s.io/v1.

A shell around machine_preservation.core.admission: parse the review, read the few objects a decision
needs, answer; plus certificate reloading, health and metrics.
"""
