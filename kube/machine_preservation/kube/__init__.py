"""Kubernetes I/O shared by the controller, the webhook and the certificates manager: how an API client is made
(`clients`) and the patch types its writes are sent as. It imports none of the components.
"""
