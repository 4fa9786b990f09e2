"""Run megatron-core 0.16.1 on a CPU-only torch build (CPU tests and CI; a no-op where CUDA exists).

``apply_cpu_shim()`` redirects the CUDA assumptions on the paths we use:

* ``torch.cuda.current_device()`` as ``device=`` (TP layer weights, ``mappings`` gathers, RoPE, DDP
  buffers, the global memory buffer) returns ``0``, which the device mode maps to the CPU;
* ``torch.cuda.synchronize()`` (``parallel_state`` barriers, pipeline ``p2p_communication``): a no-op;
* the CUDA RNG tracker (``model_parallel_cuda_manual_seed``, init/dropout ``fork()``, activation
  recompute) keeps named states of the CPU generator. Seed the default stream with ``torch.manual_seed``:
  Megatron's ``torch.cuda.manual_seed`` does nothing without CUDA;
* ``CudaToCpuMode`` maps ``device="cuda"``, ``.cuda()``, ``.to("cuda")`` to the CPU (causal mask, the
  schedules' token counter, optimizer scale, ``clip_grads``), also inside backward, and makes
  ``Tensor.type()`` report ``torch.cuda.FloatTensor`` for the optimizer/``clip_grads`` type asserts.

Side effects: ``torch.cuda.current_device``/``synchronize``, the private
``torch.autograd._engine_run_backward`` and three names in ``megatron.core.tensor_parallel.random`` are
replaced process-wide; the mode is *entered* on the calling thread and stays on (torch keeps modes per
thread: call ``apply_cpu_shim()`` on every thread that runs Megatron). Apply before
``model_parallel_cuda_manual_seed``. ``remove_cpu_shim()`` undoes everything (tests).
Keep off on CPU: sequence parallel, the fusions, the Transformer Engine spec, FP8.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

_ORIGINALS: dict[tuple[object, str], Any] = {}  # (owner, attribute) -> value before patching


def _is_cuda_device(device: object) -> bool:
    """True for ``"cuda"``, ``"cuda:1"``, ``torch.device("cuda")`` and bare ints (a CUDA index)."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)


class CudaToCpuMode(TorchFunctionMode):
    """Maps every CUDA device argument of a torch call to the CPU; see the module docstring."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:  # `.cuda()`: the tensor already lives on the only device
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:  # optimizer dtype asserts
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if _is_cuda_device(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to:  # positional device: `.to("cuda")`, `.to(0)`
            args = tuple("cpu" if i > 0 and _is_cuda_device(a) else a for i, a in enumerate(args))
        return func(*args, **kwargs)


class CpuRNGStatesTracker:
    """Megatron's named RNG streams (``add``/``fork``) as saved states of the CPU default generator.

    Mixed in front of Megatron's ``CudaRNGStatesTracker`` (its ``reset``/``get_states``/``set_states`` and
    ``isinstance`` checks still apply). ``fork(name)`` swaps the named state in for the block (TP-sharded
    weight init, attention dropout), keeps the advanced state and swaps the previous one back.
    """

    states_: dict[str, torch.Tensor]
    seeds_: set[int]

    def add(self, name: str, seed: int) -> None:
        self._is_initialized = True
        if seed in self.seeds_ or name in self.states_:
            raise Exception(f"rng state {name!r} or seed {seed} already exists")
        self.seeds_.add(seed)
        original_state = torch.default_generator.get_state()
        torch.default_generator.manual_seed(seed)
        self.states_[name] = torch.default_generator.get_state()
        torch.default_generator.set_state(original_state)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        if name not in self.states_:
            raise Exception(f"rng state {name!r} is not added")
        original_state = torch.default_generator.get_state()
        torch.default_generator.set_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.default_generator.get_state()
            torch.default_generator.set_state(original_state)


def _patch(owner: object, attribute: str, replacement: Any) -> None:
    _ORIGINALS.setdefault((owner, attribute), getattr(owner, attribute))
    setattr(owner, attribute, replacement)


def _drop_rng_tracker(tp_random: Any) -> None:
    """The next ``get_cuda_rng_tracker()`` builds a tracker of the class patched in (or restored)."""
    tp_random._CUDA_RNG_STATE_TRACKER = None
    tp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = False


def _current_thread_mode() -> CudaToCpuMode | None:
    return next((m for m in _get_current_function_mode_stack() if isinstance(m, CudaToCpuMode)), None)


def _in_device_mode(run_backward: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap the autograd engine entry so backward (activation recompute re-runs Megatron's forward) sees
    the mode: torch pops a mode while it handles ``backward()``/``autograd.grad()``, and the engine keeps
    the mode stack it started with. torch.compiler patches ``_engine_run_backward`` the same way."""

    def run_backward_in_device_mode(*args: Any, **kwargs: Any) -> Any:
        with contextlib.nullcontext() if _current_thread_mode() else CudaToCpuMode():
            return run_backward(*args, **kwargs)

    return run_backward_in_device_mode


def apply_cpu_shim() -> bool:
    """Redirect Megatron's CUDA assumptions to the CPU; returns False (and does nothing) if CUDA exists.

    Idempotent: patches are applied once per process, the device mode once per thread.
    """
    if torch.cuda.is_available():
        return False
    from megatron.core.tensor_parallel import random as tp_random

    if not _ORIGINALS:
        _patch(torch.cuda, "current_device", lambda: 0)
        _patch(torch.cuda, "synchronize", lambda device=None: None)
        # `initialize_rng_tracker` instantiates the class it finds under this module-level name.
        cpu_tracker = type("CpuRNGStatesTracker", (CpuRNGStatesTracker, tp_random.CudaRNGStatesTracker), {})
        _patch(tp_random, "CudaRNGStatesTracker", cpu_tracker)
        # Activation recompute (`CheckpointFunction`) saves/restores the "CUDA" state through these two.
        _patch(tp_random, "_get_cuda_rng_state", lambda *args, **kwargs: torch.get_rng_state())
        _patch(tp_random, "_set_cuda_rng_state", lambda state, *args, **kwargs: torch.set_rng_state(state))
        _drop_rng_tracker(tp_random)  # a tracker built before the patch would still be the CUDA one
        _patch(torch.autograd, "_engine_run_backward", _in_device_mode(torch.autograd._engine_run_backward))
    if _current_thread_mode() is None:
        CudaToCpuMode().__enter__()
    return True


def remove_cpu_shim() -> None:
    """Undo ``apply_cpu_shim()``: restore the patched attributes and leave the mode on this thread.

    Megatron's RNG tracker is reset too, so the next ``model_parallel_cuda_manual_seed`` builds a fresh one.
    """
    from megatron.core.tensor_parallel import random as tp_random

    for (owner, attribute), original in _ORIGINALS.items():
        setattr(owner, attribute, original)
    _ORIGINALS.clear()
    _drop_rng_tracker(tp_random)
    mode = _current_thread_mode()
    if mode is not None:
        if _get_current_function_mode_stack()[-1] is not mode:
            raise RuntimeError("another TorchFunctionMode was entered after the CPU shim's; exit it first")
        mode.__exit__(None, None, None)
