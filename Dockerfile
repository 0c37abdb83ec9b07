# triton-gitops as a container image: `triton-gitops run` on a slim Python, as a non-root user.
#
#   docker build -t triton-gitops .
#   docker run -p 9090:9090 -v triton-gitops:/var/lib/triton-gitops triton-gitops \
#       --repo https://github.com/example-org/triton-manifests.git --ref main
#   docker stop -t 90 ...   # SIGTERM finishes the change in progress (--shutdown-deadline, 60 s)
#
# Every option of `triton-gitops run` is also $TRITON_GITOPS_<OPTION> or a key of the YAML file
# that $TRITON_GITOPS_CONFIG names (`--config` is a global option: it cannot follow `run`).
# Precedence: flag, then environment, then config file: the ENV below wins over the file.
# One-shot commands: docker run --entrypoint triton-gitops IMAGE plan --repo URL
# Kubernetes manifests and a Grafana dashboard: examples/deploy/.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# git: the manifest mirrors (GitPython runs it); ca-certificates: https remotes;
# openssh-client: ssh:// remotes with --git-ssh-key (git only recommends it);
# gpg: `git verify-commit` for --verify-signatures.
RUN apt-get update \
    && apt-get install -y --no-install-recommends git ca-certificates openssh-client gpg \
    && rm -rf /var/lib/apt/lists/*

# A numeric non-root user, so that Kubernetes' runAsNonRoot can verify it.
RUN groupadd --system --gid 10001 triton-gitops \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/triton-gitops \
        --shell /usr/sbin/nologin triton-gitops \
    && mkdir -p /var/lib/triton-gitops/state /var/lib/triton-gitops/cache \
    && chown -R 10001:10001 /var/lib/triton-gitops

WORKDIR /src
# The dependencies first, from pyproject.toml alone: this layer is rebuilt only when they change.
COPY pyproject.toml ./
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
# Then the package itself, without extras: nvidia-pytriton is only for local runs and tests.
COPY README.md ./
COPY schemas ./schemas
COPY reconciler ./reconciler
RUN pip install . \
    && cd / && rm -rf /src

# State (SQLite: what each server was given, rollouts, holds) and Git mirrors live on a volume;
# HOME is there too, for ssh's known_hosts. Listen on every address: probes and Prometheus come
# from outside the container.
ENV HOME=/var/lib/triton-gitops \
    TRITON_GITOPS_STATE=/var/lib/triton-gitops/state/state.db \
    TRITON_GITOPS_CACHE_DIR=/var/lib/triton-gitops/cache \
    TRITON_GITOPS_LISTEN=0.0.0.0:9090
VOLUME ["/var/lib/triton-gitops"]
WORKDIR /var/lib/triton-gitops
EXPOSE 9090
USER 10001:10001

# No curl in the slim image: Python's urllib, on the port of $TRITON_GITOPS_LISTEN; a status
# other than 2xx or no answer raises, and the check fails.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('TRITON_GITOPS_LISTEN', '0.0.0.0:9090').rpartition(':')[2]; urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4)"]

ENTRYPOINT ["triton-gitops", "run"]
