# triton-gitops as a container image: `triton-gitops run` under an init process, as a non-root
# user, from a virtualenv built with the locked dependencies (requirements.lock).
#
#   docker build -t triton-gitops .                  # or: podman build --format docker ...
#   docker run -p 9090:9090 -v triton-gitops:/var/lib/triton-gitops triton-gitops \
#       --repo https://github.com/example-org/triton-manifests.git --ref main
#   docker stop -t 90 ...   # SIGTERM finishes the change in progress (--shutdown-deadline, 60 s)
#
# The base is a build argument: python:3.11-slim by default; any Debian with python3 and
# python3-venv works (`./dev image` builds on a Debian bookworm base made with mmdebstrap, as
# tests/integration/test_image.py does where no registry image can be pulled).
# VERSION, REVISION and SOURCE go into the OCI labels: `./dev image` passes them (the version
# and the project's home from pyproject.toml, the commit from Git) and tags the image with the
# release's name and version from pyproject.toml.
#
# Every option of `triton-gitops run` is also $TRITON_GITOPS_<OPTION> or a key of the YAML file
# that $TRITON_GITOPS_CONFIG names (or `--config FILE`, before or after `run`).
# Precedence: flag, then environment, then config file: the ENV below wins over the file.
# One-shot commands: docker run --entrypoint triton-gitops IMAGE plan --repo URL
# Kubernetes manifests and a Grafana dashboard: examples/deploy/.
ARG BASE=python:3.11-slim

# -- build: the virtualenv, and nothing of this stage but it reaches the image ----------------
FROM ${BASE} AS build
# Named ours, as the image is: ./dev image removes the untagged ones an earlier build left.
LABEL org.opencontainers.image.title="triton-gitops"
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
# The locked dependencies first, by hash and without resolving (--no-deps): this layer is
# rebuilt only when a lock file changes. Wheels only: no compiler is needed, or installed.
# requirements-build.lock pins the build backend (hatchling) in a virtualenv of its own.
COPY requirements.lock requirements-build.lock ./
RUN python3 -m venv /opt/build \
    && /opt/build/bin/pip install --require-hashes --no-deps --only-binary :all: \
        -r requirements-build.lock \
    && python3 -m venv /opt/triton-gitops \
    && /opt/triton-gitops/bin/pip install --require-hashes --no-deps --only-binary :all: \
        -r requirements.lock
# Then the package itself, without its dependencies (they are the lock's) and without extras:
# nvidia-pytriton is only for local runs and tests. pip leaves the runtime virtualenv.
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY reconciler ./reconciler
RUN /opt/build/bin/pip wheel --no-build-isolation --no-deps --wheel-dir /tmp/dist . \
    && /opt/triton-gitops/bin/pip install --no-deps /tmp/dist/*.whl \
    && /opt/triton-gitops/bin/pip uninstall --yes pip setuptools

# -- the image ---------------------------------------------------------------------------------
FROM ${BASE}
# `./dev image` passes VERSION and SOURCE from pyproject.toml, and REVISION from Git.
ARG VERSION=unknown
ARG REVISION=unknown
ARG SOURCE=https://github.com/triton-gitops/triton-gitops
LABEL org.opencontainers.image.title="triton-gitops" \
      org.opencontainers.image.description="GitOps reconciler for NVIDIA Triton Inference Server" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"

# git: the manifest mirrors (GitPython runs it); ca-certificates: https remotes;
# openssh-client: ssh:// remotes with --git-ssh-key (git only recommends it);
# gnupg: `git verify-commit` for --verify-signatures; tini: PID 1, which reaps the git
# processes GitPython kills at a timeout and passes SIGTERM on; procps: `ps`, which GitPython's
# timeout kill runs to find a git process's children.
# A numeric non-root user, so that Kubernetes' runAsNonRoot can verify it.
# One layer: every layer is a full copy of the file system under podman's vfs storage.
RUN apt-get update \
    && apt-get install -y --no-install-recommends git ca-certificates openssh-client gnupg tini procps \
    && apt-get clean && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 triton-gitops \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/triton-gitops \
        --shell /usr/sbin/nologin triton-gitops \
    && mkdir -p /var/lib/triton-gitops/state /var/lib/triton-gitops/cache \
    && chown -R 10001:10001 /var/lib/triton-gitops

COPY --from=build /opt/triton-gitops /opt/triton-gitops

# State (SQLite: what each server was given, rollouts, holds) and Git mirrors live on a volume;
# HOME is there too, for ssh's known_hosts. Listen on every address: probes and Prometheus come
# from outside the container. No .pyc written at run time: the root may be read-only, and pip
# compiled the package when it installed it.
ENV PATH=/opt/triton-gitops/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/triton-gitops \
    TRITON_GITOPS_STATE=/var/lib/triton-gitops/state/state.db \
    TRITON_GITOPS_CACHE_DIR=/var/lib/triton-gitops/cache \
    TRITON_GITOPS_LISTEN=0.0.0.0:9090
VOLUME ["/var/lib/triton-gitops"]
WORKDIR /var/lib/triton-gitops
EXPOSE 9090
USER 10001:10001

# No curl in the image: Python's urllib, on the port of $TRITON_GITOPS_LISTEN; a status other
# than 2xx or no answer raises, and the check fails. (Kept by `docker build` and by
# `podman build --format docker`; the OCI format has no health check.)
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('TRITON_GITOPS_LISTEN', '0.0.0.0:9090').rpartition(':')[2]; urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4)"]

# tini forwards SIGTERM to triton-gitops alone (not to its process group: a git fetch in
# progress is left to finish within --shutdown-deadline) and exits with its exit code.
ENTRYPOINT ["/usr/bin/tini", "--", "triton-gitops", "run"]
