"""Kubernetes I/O shared by the controller, the webhook and the certificates manager: how an API client is made
and the patch types its writes are sent as (`clients`), what an API answer means (`api_errors`: the one error
vocabulary every component catches), the informer (`informer`), and the control cluster's CRDs read once for all
their users (`crds`). It imports none of the components.
"""
