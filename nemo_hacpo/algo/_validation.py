"""Shape and hyper-parameter checks shared by the algorithm functions (clear errors, no device syncs)."""

from __future__ import annotations

import math

import torch


def require_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def require_shape(name: str, value: torch.Tensor, shape: tuple[int | None, ...], layout: str) -> None:
    """`shape` entries of None match any size; `layout` names the dimensions for the message."""
    require_tensor(name, value)
    ok = value.ndim == len(shape) and all(
        want is None or got == want for got, want in zip(value.shape, shape, strict=False)
    )
    if not ok:
        wanted = ", ".join("?" if want is None else str(want) for want in shape)
        raise ValueError(f"{name} must have shape {layout} = ({wanted}), got {tuple(value.shape)}")


def require_bool(name: str, value: torch.Tensor) -> None:
    if value.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor, got dtype {value.dtype}")


def require_floating(name: str, value: torch.Tensor) -> None:
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")


def compute_dtype(value: torch.Tensor) -> torch.dtype:
    """At least float32: half-precision log-probs are summed in float32."""
    return torch.promote_types(value.dtype, torch.float32)


def require_finite_number(
    name: str, value: float, *, low: float | None = None, high: float | None = None
) -> float:
    """`value` as a float, finite and inside [low, high] (bounds inclusive, None = unbounded)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
        raise ValueError(f"{name} must be finite and in {bounds}, got {value!r}")
    return value


def require_positive_count(name: str, value: float | int | None) -> float | None:
    """A global normaliser: None (use the local count) or a positive finite number."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be None or a positive number, got {value!r}")
    return float(value)
