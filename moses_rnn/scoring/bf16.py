"""A bfloat16 copy of a model for scoring: affine maps with weights cast once, the output layer kept in float32.

Why these layers and not others: docs/scoring.md, "bfloat16: --dtype bf16".
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F


class Bf16Linear(nn.Module):
    """x W^T + b with W cast to bfloat16 once: bfloat16 inputs, float32 accumulation (oneDNN on CPU,
    cuBLAS on GPU), result returned as float32 and the bias added in float32. `weight` stays readable
    (RNNsearch slices it), in bfloat16."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(linear.weight.detach().to(torch.bfloat16), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x.to(torch.bfloat16), self.weight).float()
        return y if self.bias is None else y.add_(self.bias)


class Float32Output(nn.Module):
    """The output layer of a bfloat16 copy, kept in float32 (autocast off): the logits feed the
    softmax normaliser, where bfloat16's 8-bit mantissa would move log p by several hundredths."""

    def __init__(self, output: nn.Module):
        super().__init__()
        self.inner = output

    def logits(self, s: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        with torch.autocast(s.device.type, enabled=False):
            return self.inner.logits(s.float(), rows)

    def log_probs(self, s: torch.Tensor, y: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
        with torch.autocast(s.device.type, enabled=False):
            return self.inner.log_probs(s.float(), y, chunk)


def bfloat16_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` for bfloat16 scoring: every nn.Linear outside the output layer becomes a
    `Bf16Linear` (weights cast once, not on every call as autocast would), the output layer a
    `Float32Output`. Run it under `runtime.autocast(device, torch.bfloat16)`, which covers the products
    that architectures compute from raw weights (RNNsearch's F.linear on slices of U)."""
    dup = copy.deepcopy(model)
    for name, module in list(dup.named_modules()):
        if name == "output" or name.startswith("output."):
            continue  # the output layer stays float32
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, Bf16Linear(child))
    dup.output = Float32Output(dup.output)
    return dup.eval()
