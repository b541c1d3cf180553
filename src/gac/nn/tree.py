"""Swapping a module of a model for another, by its fully qualified name."""

from __future__ import annotations

from torch import nn


def get_submodule_parent(model: nn.Module, fqn: str) -> tuple[nn.Module, str]:
    """The parent module of ``fqn`` and the child's attribute name."""
    parent_name, _, child = fqn.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), child


def replace_module(model: nn.Module, fqn: str, new: nn.Module) -> nn.Module:
    """Swap the module at ``fqn`` for ``new`` and return the old one."""
    parent, child = get_submodule_parent(model, fqn)
    old = getattr(parent, child)
    setattr(parent, child, new)
    return old
