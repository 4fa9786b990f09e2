# nemo_hacpo for GPU clusters (H100/H200, multi-node): CUDA torch + vLLM from NVIDIA's NGC vLLM image,
# Transformer Engine (FP8) built against that torch, megatron-core, and this package with the gpu/eval extras.
#
#   docker build -t nemo-hacpo:latest .
#   enroot import dockerd://nemo-hacpo:latest    # for Slurm + pyxis (srun --container-image=...)
#
# Not built on the CPU development machines (no Docker engine there); the CPU path is scripts/setup.sh.
ARG BASE_IMAGE=nvcr.io/nvidia/vllm:25.09-py3
FROM ${BASE_IMAGE}

ENV PIP_NO_CACHE_DIR=1 \
    HF_HUB_OFFLINE=1 \
    HF_DATASETS_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    NVTE_FRAMEWORK=pytorch

# Keep the image's torch: every later install is constrained to it.
RUN python -c "import torch; print(f'torch=={torch.__version__}')" > /tmp/torch-constraint.txt

# Transformer Engine compiles against the installed torch (no build isolation), then megatron-core.
RUN pip install -c /tmp/torch-constraint.txt --no-build-isolation "transformer-engine[pytorch]>=2.4" && \
    pip install -c /tmp/torch-constraint.txt "megatron-core>=0.16.1"

WORKDIR /opt/nemo_hacpo
COPY pyproject.toml README.md ./
COPY nemo_hacpo ./nemo_hacpo
COPY conf ./conf
COPY recipes ./recipes
COPY slurm ./slurm
# vLLM comes with the base image; the `gpu` extra would re-resolve it, so install the package with `eval` only.
RUN pip install -c /tmp/torch-constraint.txt -e ".[eval]" && \
    python -c "import torch, megatron.core, transformer_engine, vllm, nemo_hacpo; print('ok', torch.__version__)"

ENTRYPOINT []
CMD ["python", "recipes/train.py", "--help"]
