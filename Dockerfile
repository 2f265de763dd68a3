# certify on a CUDA runtime. Not buildable on the project's CI machines (no Docker engine); the
# wheel it installs is the one tests/test_wheel.py builds, installs into a fresh venv and runs.

# Stage 1: build certify's wheel, with build isolation (pip fetches setuptools), no dependencies.
FROM ubuntu:24.04 AS wheel
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv python3-pip \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Everything the build reads: metadata, package discovery, the package and its mapped data.
COPY pyproject.toml setup.py README.md ./
COPY certify ./certify
COPY templates ./templates
COPY suites ./suites
RUN python3 -m venv /opt/build \
 && /opt/build/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

# Stage 2: the runtime installs that same wheel (and its dependencies) into a fresh venv.
FROM nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv python3-pip \
      libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz-subset0 fonts-dejavu-core \
 && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 certify
COPY --from=wheel /dist/ /tmp/dist/
# onnxruntime-gpu is selected by the wheel's metadata on Linux x86_64.
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir /tmp/dist/certify-*.whl \
 && rm -rf /tmp/dist
ENV PATH="/opt/venv/bin:${PATH}"

# Caches anyone can write. Run as yourself (`docker run --user "$(id -u):$(id -g)" -v
# "$PWD:/work" -w /work ...`) so that the card written into the mounted folder is yours: that UID
# has no home in the image (Docker sets HOME=/, not writable), so fontconfig's cache (WeasyPrint;
# under XDG_CACHE_HOME) and CUDA's kernel cache would have nowhere to go. /tmp is
# writable by every UID (mode 1777) and each tool creates its folder there. certify itself writes
# only under --out.
ENV XDG_CACHE_HOME=/tmp/certify-cache \
    CUDA_CACHE_PATH=/tmp/certify-cache/nv

USER certify
WORKDIR /home/certify
ENTRYPOINT ["certify"]
CMD ["--help"]
