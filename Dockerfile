# syntax=docker/dockerfile:1
# The operator image: kopf plus stabletrain's operator extra, no torch, running as a
# non-root user on a read-only root file system (the chart mounts /tmp). It runs the
# operator's entry point, `python -m stabletrain_operator`: kopf.run with the handlers of
# stabletrain_operator.register_handlers (what `kopf run -m stabletrain_operator.register_handlers` loads) plus the
# operator's Prometheus endpoint, which plain `kopf run` would not start.
#
#   docker build -t <registry>/stabletrain-operator:0.1.0 .
#
# Stage 1 builds the stabletrain wheel from this source tree; stage 2 installs
# `stabletrain[operator]` from that wheel (dependencies from the package index) into a
# virtualenv; stage 3 copies only the virtualenv onto a clean base. Training images do
# not use this file: they add `pip install stabletrain[agent]` (docs/operations.md).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY contract ./contract
COPY operator ./operator
COPY trainer-agent ./trainer-agent
RUN python -m pip wheel --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=wheel /wheels /wheels
# The same path as in the final stage: a virtualenv's scripts name their interpreter by path.
RUN python -m venv /opt/stabletrain \
    && /opt/stabletrain/bin/pip install --no-compile --find-links /wheels "stabletrain[operator]" \
    && /opt/stabletrain/bin/python -c "import kopf, stabletrain_operator.register_handlers" \
    && if /opt/stabletrain/bin/python -c "import torch" 2>/dev/null; then \
         echo "torch must not be in the operator image" >&2; exit 1; fi

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="stabletrain-operator" \
      org.opencontainers.image.description="kopf operator that rolls StableTrainingJobs back from loss spikes and NaNs" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed numeric non-root user, so runAsNonRoot can verify it without a passwd lookup.
RUN groupadd --system --gid 65532 stabletrain \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin stabletrain
COPY --from=venv /opt/stabletrain /opt/stabletrain
ENV PATH=/opt/stabletrain/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
WORKDIR /tmp
# 8080: kopf's liveness endpoint (/healthz); 9090: the operator's Prometheus metrics.
EXPOSE 8080 9090
# Without arguments: every namespace, standalone (no peering). The chart passes its own
# (--namespace, --peering, --metrics-port, --liveness).
ENTRYPOINT ["python", "-m", "stabletrain_operator"]
CMD ["--metrics-port=9090", "--liveness=http://0.0.0.0:8080/healthz"]
