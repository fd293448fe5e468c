# tunebench: an offline image for GPU nodes. Versions are pinned by constraints.txt (the lock CI uses).
#   docker build -t REGISTRY/tunebench:TAG .
#   docker build -t REGISTRY/tunebench:TAG --build-arg MODEL_DIR=models/my-llama .   # bake a local model in
#   docker push REGISTRY/tunebench:TAG
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04

# --- build: a virtual environment with torch, the pinned dependencies and tunebench
FROM ${CUDA_IMAGE} AS build
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/tunebench
ENV PATH=/opt/tunebench/bin:$PATH
WORKDIR /src
COPY constraints.txt pyproject.toml README.md ./
COPY src ./src
# torch first (its CUDA build from PyPI), then DeepSpeed without build isolation (it builds against
# that torch; its CUDA ops compile at run time), then tunebench with every pin from constraints.txt.
RUN pip install -c constraints.txt torch \
 && DS_BUILD_OPS=0 pip install --no-build-isolation -c constraints.txt deepspeed \
 && pip install -c constraints.txt ".[all]"

# --- runtime: the CUDA runtime, the environment, a non-root user, no network needed
FROM ${CUDA_IMAGE} AS runtime
ARG MODEL_DIR=docker/model-none
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    PATH=/opt/tunebench/bin:$PATH TUNEBENCH_STORE=/results/results.db
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 1000 tunebench \
 && mkdir -p /results /models && chown tunebench /results /models
COPY --from=build /opt/tunebench /opt/tunebench
COPY --chown=tunebench ${MODEL_DIR} /models/model
USER 1000
WORKDIR /home/tunebench
ENTRYPOINT ["tunebench"]
CMD ["--help"]
