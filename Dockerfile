# certify on a CUDA runtime. Not buildable on the project's CI machines (no Docker engine);
# kept consistent with scripts/setup.sh, which is the tested install.
FROM nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv python3-pip \
      libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz-subset0 fonts-dejavu-core \
 && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 certify
WORKDIR /opt/certify
COPY pyproject.toml README.md ./
COPY certify ./certify
COPY templates ./templates
COPY suites ./suites

# onnxruntime-gpu is selected by pyproject.toml on Linux x86_64.
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir . \
 && chown -R certify:certify /opt/certify
ENV PATH="/opt/venv/bin:${PATH}"

USER certify
WORKDIR /home/certify
ENTRYPOINT ["certify"]
CMD ["--help"]
