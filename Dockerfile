# nemo_hacpo for GPU clusters (H100/H200, multi-node). The base is NVIDIA's NGC NeMo image, which carries the
# CUDA torch build, Transformer Engine (FP8), apex and megatron-core; vLLM is compiled against that very torch
# (vLLM's documented "use existing PyTorch" build), so the container's torch is never replaced. Then this
# package with the `eval` extra (the `gpu` extra would re-resolve vLLM and TE from PyPI: not used here).
#
#   docker build -t nemo-hacpo:latest .                     # ~1 h: vLLM's CUDA kernels compile
#   enroot import dockerd://nemo-hacpo:latest               # for Slurm + pyxis (CONTAINER_IMAGE=... sbatch ...)
#
# Not built on the CPU development machines (no Docker engine there); the CPU path is scripts/setup.sh.
ARG BASE_IMAGE=nvcr.io/nvidia/nemo:25.09
FROM ${BASE_IMAGE}
ARG VLLM_VERSION=v0.11.0
ARG TORCH_CUDA_ARCH_LIST="9.0"
ARG MAX_JOBS=16

ENV PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false NVTE_FRAMEWORK=pytorch

# Every install below is constrained to the image's torch, Transformer Engine and megatron-core.
RUN python - <<'PY' > /tmp/constraints.txt
import importlib.metadata as md
for name in ("torch", "transformer-engine", "megatron-core"):
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        pass
PY

# vLLM from source against the existing torch (no wheel that pins another torch).
RUN git clone --depth 1 --branch ${VLLM_VERSION} https://github.com/vllm-project/vllm.git /opt/vllm && \
    cd /opt/vllm && python use_existing_torch.py && \
    pip install -c /tmp/constraints.txt -r requirements/build.txt && \
    TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST}" MAX_JOBS=${MAX_JOBS} \
    pip install -c /tmp/constraints.txt --no-build-isolation -e .

WORKDIR /opt/nemo_hacpo
COPY pyproject.toml README.md ./
COPY nemo_hacpo ./nemo_hacpo
COPY conf ./conf
COPY recipes ./recipes
COPY slurm ./slurm
RUN pip install -c /tmp/constraints.txt -e ".[eval]" && \
    python -c "import torch, megatron.core, transformer_engine, apex, vllm, nemo_hacpo; print('ok', torch.__version__, vllm.__version__)"

ENTRYPOINT []
CMD ["python", "recipes/train.py", "--help"]
