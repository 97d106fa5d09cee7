# Image for both components; the Helm chart (charts/machine-preservation) runs it with
#   args: [--log-level=..., webhook, --port=10250, --cert-dir=/certs, ...]   (container port 10250, HTTPS)
#   args: [--log-level=..., certs, run, ...]                                    (init container and sidecar)
#   args: [--log-level=..., controller, ..., --metrics-port=8080]              (container port 8080)
# Keep ENTRYPOINT, USER and the ports in sync with the chart (tests/integration/test_chart.py checks).
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/venv/bin/pip install --no-cache-dir .

FROM python:3.12-slim
COPY --from=build /opt/venv /opt/venv
# Read-only root filesystem: never write bytecode; unbuffered logs.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Non-root, matching the chart's podSecurityContext (runAsUser/runAsGroup 65532).
USER 65532:65532
EXPOSE 10250 8080
ENTRYPOINT ["machine-preservation"]
