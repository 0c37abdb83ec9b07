# The reconciler as a container image: the package and its dependencies on a slim Python.
# Build: docker build -t triton-gitops .   Run: docker run triton-gitops apply --repo URL
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends git ca-certificates \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml README.md ./
COPY reconciler ./reconciler
COPY schemas ./schemas
RUN pip install --no-cache-dir . && rm -rf /src

RUN useradd --create-home --uid 10001 reconciler
USER reconciler
WORKDIR /home/reconciler
ENV TRITON_GITOPS_STATE=/home/reconciler/state/state.db \
    TRITON_GITOPS_CACHE_DIR=/home/reconciler/cache

ENTRYPOINT ["triton-gitops"]
CMD ["--help"]
