# Image for every component; the Helm chart (charts/machine-preservation) runs it with
#   args: [--log-level=..., webhook, --port=10250, --cert-dir=/certs, ...]   (container port 10250, HTTPS)
#   args: [--log-level=..., certs, run, ...]                                    (the certs manager's Deployment)
#   args: [--log-level=..., controller, ..., --metrics-port=8080]              (container port 8080)
# Keep ENTRYPOINT, USER and the ports in sync with the chart (tests/integration/test_chart_render.py checks).
#
# Supply chain (tests/unit/test_supply_chain.py checks): the base image is pinned by digest (python:3.12-slim,
# Python 3.12.14 on Debian trixie when pinned; to move it, pull the tag and put its index digest in both FROM
# lines); every third-party package comes from a lock file with exact versions and hashes (`make lock`), as
# wheels only, so nothing unpinned is fetched or built; the project itself is installed with --no-deps.
FROM python:3.12-slim@sha256:78387bc3881b8273120a12ebe6c1ab22b018ccc2c9adf565ae1ac9b536e184ea AS build
WORKDIR /src
COPY requirements.lock requirements-build.lock ./
# /opt/venv is what ships; /opt/build holds setuptools only to build the project's wheel.
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --require-hashes --only-binary=:all: -r requirements.lock \
 && python -m venv /opt/build \
 && /opt/build/bin/pip install --no-cache-dir --require-hashes --only-binary=:all: -r requirements-build.lock
COPY pyproject.toml README.md ./
# Only the production components: pyproject.toml's package list names exactly these (the developer tools,
# localcluster/ and playground/, are not part of the distribution).
COPY cli ./cli
COPY core ./core
COPY kube ./kube
COPY certs ./certs
COPY webhook ./webhook
COPY controller ./controller
RUN /opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels . \
 && /opt/venv/bin/pip install --no-cache-dir --no-deps --no-index /wheels/*.whl \
 && /opt/venv/bin/pip check \
 && /opt/venv/bin/machine-preservation --help

FROM python:3.12-slim@sha256:78387bc3881b8273120a12ebe6c1ab22b018ccc2c9adf565ae1ac9b536e184ea
COPY --from=build /opt/venv /opt/venv
# Read-only root filesystem: never write bytecode; unbuffered logs. Temporary files (the kubernetes client
# writes a kubeconfig's embedded certificates to files) go to the writable emptyDir the chart mounts on /tmp
# and names in TMPDIR.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Non-root, matching the chart's podSecurityContext (runAsUser/runAsGroup 65532).
USER 65532:65532
EXPOSE 10250 8080
ENTRYPOINT ["machine-preservation"]
