# syntax=docker/dockerfile:1
# Build a wheel in one stage; install only the wheel and its dependencies in the final one.
FROM python:3.11-slim AS build
# A C compiler for the compiled hot path (mypyc), and the C library's headers, which gcc
# only recommends; the final stage has neither. The image's Python ships its own headers.
# Unpinned: the base image's Debian release fixes gcc's version, and a pin breaks at its
# next point release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY build_backend ./build_backend
COPY sidecar ./sidecar
# With the [otel] extra: tracing is switched on by OTEL_* variables alone, no other image;
# the SDK is loaded only then. SIDECAR_COMPILE=1: the hot path compiled, and a broken
# compiler fails the build rather than ship a pure-Python image unseen. The wheels go to a
# directory under WORKDIR so that .ci/run can run this very line in a copy of the sources.
RUN SIDECAR_COMPILE=1 pip wheel --no-cache-dir --wheel-dir wheels '.[otel]'

FROM python:3.11-slim
# The sidecar listens on 127.0.0.1 unless told otherwise, and a container's loopback cannot
# be reached through a published port or from another container: the image listens on
# every interface. In a pod, `inject` and the chart put the proxy back on loopback.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SIDECAR_HOST=0.0.0.0 \
    SIDECAR_ADMIN_HOST=0.0.0.0
COPY --from=build /src/wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin sidecar
USER 10001
EXPOSE 8090 9464
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('SIDECAR_ADMIN_PORT', '9464'), timeout=2)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["tool-retry-sidecar", "serve"]
