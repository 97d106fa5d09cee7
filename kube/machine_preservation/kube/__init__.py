"""Kubernetes I/O shared by the controller, the webhook and the certificates manager: how an API client is made
and the patch types its writes are sent as (`clients`), and what an API answer means (`api_errors`). It imports
none of the components.
"""
