"""Optional recovery after pruning (LLM-Pruner's post-training step): a short LoRA fine-tune.

``recover_lora_(model, batches)`` wraps the decoder projections in ``peft`` LoRA adapters, trains
them for ``steps`` optimizer steps on the language-modelling loss of calibration text (AdamW), and
merges them back, so the result has the same modules and shapes as before (a plain pruned
model; nothing of peft remains). The paper tunes on Alpaca for 2 epochs at rank 8; here the
steps, rank and learning rate are options and the text is the calibration source.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from gac.errors import GacError
from gac.utils import track

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def recover_lora_(
    model: nn.Module,
    batches: Sequence[torch.Tensor],
    steps: int = 20,
    rank: int = 8,
    alpha: int = 16,
    lr: float = 1e-4,
) -> dict[str, Any]:
    """Fine-tune LoRA adapters on ``batches`` for ``steps`` steps and merge them into ``model`` (in place).

    Returns:
        ``{"steps", "rank", "alpha", "lr", "loss_first", "loss_last"}``.

    Raises:
        GacError: peft missing, no batches, or bad options.
    """
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise GacError(
            "--recover lora needs peft: pip install 'gac[recover]' (or pip install peft)"
        ) from None
    if steps < 1 or rank < 1 or not lr > 0:
        raise GacError(f"LoRA recovery needs steps >= 1, rank >= 1 and lr > 0 (got {steps}, {rank}, {lr})")
    if not batches:
        raise GacError("LoRA recovery needs calibration text (got no windows)")
    present = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    targets = [t for t in TARGETS if t in present]
    cfg = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets, bias="none")
    saved = {n: p.requires_grad for n, p in model.named_parameters()}
    pm = get_peft_model(model, cfg)
    params = [p for p in pm.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    dev = next(model.parameters()).device
    losses: list[float] = []
    pm.train()
    for b in track(list(itertools.islice(itertools.cycle(batches), steps)), "lora recovery"):
        b = b.to(dev)
        loss = pm(input_ids=b, labels=b).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    merged = pm.merge_and_unload()
    if merged is not model:  # merge_and_unload returns the base model, modified in place
        raise GacError("peft returned a new model object; cannot merge in place")
    for n, p in model.named_parameters():
        p.requires_grad_(saved.get(n, False))
    model.eval()
    return {
        "steps": steps,
        "rank": rank,
        "alpha": alpha,
        "lr": lr,
        "loss_first": losses[0],
        "loss_last": losses[-1],
    }
