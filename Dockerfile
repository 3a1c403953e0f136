# The fleetwarden image: one image, three commands, as the Helm chart expects
# (`image.repository`, default ghcr.io/fleetwarden/fleetwarden:<appVersion>):
#   fleetwarden operator   the chart's operator Deployment
#   fleetwarden sidecar    the scheduler sidecar the operator adds to every serving pod
#   fleetwarden batch      the Batch API and NIW dispatcher (chart value batch.enabled)
#
#   docker build -t ghcr.io/<you>/fleetwarden:0.1.0 .
#
# The build stage makes a wheel, so the simulator's hot modules are compiled with mypyc
# (setup.py; docs/performance.md, "Compiled build"); the runtime stage installs only that wheel
# and its dependencies, and runs as the UID the chart and the operator's pod templates set.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY fleetwarden ./fleetwarden
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && ls /wheels/*.whl

FROM ${PYTHON_IMAGE}
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MPLCONFIGDIR=/tmp/matplotlib
COPY --from=build /wheels /wheels
# pip compiles every module to bytecode here, so a read-only root filesystem costs nothing.
RUN pip install --no-cache-dir /wheels/*.whl \
 && rm -rf /wheels \
 && fleetwarden --help >/dev/null
USER 65532:65532
ENTRYPOINT ["fleetwarden"]
CMD ["--help"]
