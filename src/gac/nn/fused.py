"""Horizontal fusion: one GEMM for the projections that read the same input.

In a Llama-style block, ``q_proj``, ``k_proj`` and ``v_proj`` all read the same hidden
state, and so do ``gate_proj`` and ``up_proj``.  At decode time each of them is a small
GEMV, so launches and tails dominate.  :func:`fuse_projections_` replaces such a group by

* one :class:`FusedInputProjection` on the parent module, holding the rows of every
  member's *first stage* concatenated: the full weight of a dense ``nn.Linear`` member,
  the ``v`` factor of a :class:`~gac.nn.FactorizedLinear` member;
* one :class:`FusedSlice` per member, in the member's place: it asks the group for its
  slice of the fused product (computed once per input) and, for a factorized member,
  applies the member's own ``u`` factor.

The transform is exact up to floating-point summation order (the same dot products, one
launch), keeps device and dtype, and has a way back (:func:`unfuse_projections_`).
The attention and MLP code of the model is untouched: it still calls ``self.q_proj(x)``.

These are module types, low in the house: the fused group computes its first stage with
``F.linear``.  The fast path's dispatches (:mod:`gac.runtime`) swap a group for
:class:`gac.runtime.modules.DispatchedGroup`, which runs the measured kernels where they were faster.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gac.nn.factorized import FactorizedLinear

#: sibling projections fused by default; a dotted name is a member's child (PaLU's latent attention:
#: its queries and the down-projections of its key and value latents read the same hidden state)
DEFAULT_GROUPS: tuple[tuple[str, ...], ...] = (
    ("q_proj", "k_proj", "v_proj"),
    ("q_proj", "k_proj.down", "v_proj.down"),
    ("gate_proj", "up_proj"),
)


class FusedInputProjection(nn.Module):
    """The concatenated first stage of several projections of one input.

    Args:
        members: ``nn.Linear`` or ``FactorizedLinear`` modules with the same ``in_features``.

    The product is computed once per distinct input tensor and handed out slice by slice;
    it is dropped as soon as every member has taken its slice, so no activation is kept
    between forward passes.
    """

    #: each member's ``u`` (None for a dense member): a plain list, the modules are registered by
    #: the members' :class:`FusedSlice`
    seconds: list[nn.Module | None]

    def __init__(self, members: list[nn.Module]) -> None:
        super().__init__()
        ws, bs, self.splits, self.kinds = [], [], [], []
        self.seconds = [m.u if isinstance(m, FactorizedLinear) else None for m in members]
        any_bias = False
        for m in members:
            if isinstance(m, FactorizedLinear):
                w, b, kind = m.v.weight, None, "factorized"
            elif isinstance(m, nn.Linear):
                w, b, kind = m.weight, m.bias, "linear"
            else:
                raise TypeError(f"cannot fuse a {type(m).__name__}; only nn.Linear and FactorizedLinear")
            any_bias |= b is not None
            ws.append(w)
            bs.append(b)
            self.splits.append(int(w.shape[0]))
            self.kinds.append(kind)
        ins = {int(w.shape[1]) for w in ws}
        if len(ins) != 1:
            raise ValueError(f"members disagree on in_features: {sorted(ins)}")
        self.in_features = ins.pop()
        self.weight = nn.Parameter(torch.cat([w.detach() for w in ws], 0), requires_grad=False)
        if any_bias:
            parts = [
                b.detach() if b is not None else torch.zeros(n, dtype=ws[0].dtype, device=ws[0].device)
                for b, n in zip(bs, self.splits, strict=True)
            ]
            self.bias = nn.Parameter(torch.cat(parts), requires_grad=False)
        else:
            self.bias = None
        self._x: torch.Tensor | None = None  # the input whose product is held in ``_parts``
        self._version: int = -1
        self._parts: list[torch.Tensor | None] = []

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Slice ``index`` of ``x @ W_catᵀ (+ b)``, computing the product once per input.

        The input is recognised by identity (``is``), which ``torch.compile`` traces without a
        graph break; eager mode also checks the tensor's version counter (an in-place change of
        ``x`` between two members recomputes).  Once every member has taken its slice the state
        is back to empty, so a compiled caller sees the same module state on every call and is
        not recompiled.
        """
        stale = self._x is not x or self._parts[index] is None
        if not stale and not torch.compiler.is_compiling():
            stale = x._version != self._version
        if stale:
            self._parts = self._products(x)
            self._x = x
            if not torch.compiler.is_compiling():
                self._version = x._version
        out = self._parts[index]
        self._parts[index] = None
        if all(p is None for p in self._parts):
            self._x, self._parts = None, []
        assert out is not None
        return out

    def applies_seconds(self, x: torch.Tensor) -> bool:
        """Whether the group hands out finished outputs for ``x`` (its members' ``u`` applied): never
        here; a dispatched group (:class:`gac.runtime.modules.DispatchedGroup`) does where measured faster."""
        return False

    def _products(self, x: torch.Tensor) -> list[torch.Tensor | None]:
        """Every member's slice of ``x @ W_catᵀ (+ b)``, or its output where :meth:`applies_seconds`."""
        return aligned_split(F.linear(x, self.weight, self.bias), self.splits)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, splits={self.splits}, kinds={self.kinds}"


def aligned_split(
    y: torch.Tensor, sizes: list[int], keep: list[bool] | None = None
) -> list[torch.Tensor | None]:
    """``y.split(sizes, -1)``, with every slice that does not start on a 16-byte boundary copied.

    ``keep[i]`` False leaves slice ``i`` out (None in its place: neither sliced nor copied).

    A slice at an odd offset of a bf16 row (a member of rank 37 after one of rank 7) is a view whose
    data pointer is only 2-byte aligned.  Some CUDA kernels assume 16-byte alignment of what they
    are given: on the H200 (torch 2.11) a tiny Llama whose fused q/k/v handed ``v`` to SDPA at an
    88-byte offset died with ``misaligned address`` in ``scaled_dot_product_attention``; with the
    copies it ran.  Whether a slice needs the copy follows from ``sizes`` and the dtype alone
    (``y`` is a fresh allocation), so a compiled caller sees the same graph on every call.  Ranks
    and widths that are multiples of 8 (what ``--align gac`` selects for 2-byte dtypes) never copy.
    """
    esize = y.element_size()
    total = sum(sizes)
    parts: list[torch.Tensor | None] = []
    off = 0
    for i, (part, n) in enumerate(zip(y.split(sizes, dim=-1), sizes, strict=True)):
        aligned = (off * esize) % 16 == 0 and (y.dim() < 2 or y.numel() == total or (total * esize) % 16 == 0)
        if keep is not None and not keep[i]:
            parts.append(None)
        else:
            parts.append(part if aligned else part.clone(memory_format=torch.contiguous_format))
        off += n
    return parts


class FusedSlice(nn.Module):
    """A member of a fused group: its slice of the shared GEMM, then its own ``u`` if factorized."""

    def __init__(self, group: FusedInputProjection, index: int, original: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "group", group)  # owned by the parent module, not registered twice
        self.index = index
        self.in_features = group.in_features
        self.out_features = int(getattr(original, "out_features", group.splits[index]))
        self.u = original.u if isinstance(original, FactorizedLinear) else None

    @property
    def rank(self) -> int | None:
        return self.group.splits[self.index] if self.u is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.group.part(x, self.index)
        return self.u(y) if self.u is not None and not self.group.applies_seconds(x) else y

    def to_original(self) -> nn.Module:
        """The stand-alone ``nn.Linear`` / ``FactorizedLinear`` this slice came from."""
        g = self.group
        lo = sum(g.splits[: self.index])
        hi = lo + g.splits[self.index]
        w = g.weight.detach()[lo:hi]
        if self.u is None:
            b = g.bias.detach()[lo:hi] if g.bias is not None else None
            lin = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device=w.device, dtype=w.dtype)
            with torch.no_grad():
                lin.weight.copy_(w)
                if b is not None:
                    lin.bias.copy_(b)
            return lin
        fl = FactorizedLinear(
            w.shape[1],
            w.shape[0],
            self.u.out_features,
            bias=self.u.bias is not None,
            device=w.device,
            dtype=w.dtype,
        )
        with torch.no_grad():
            fl.v.weight.copy_(w)
        fl.u = self.u
        return fl

    def extra_repr(self) -> str:
        return f"index={self.index}, in_features={self.in_features}, out_features={self.out_features}, factorized={self.u is not None}"


def _member(parent: nn.Module, path: str) -> tuple[nn.Module | None, str, nn.Module | None]:
    """``(owner, attribute, module)`` of the (dotted) child ``path`` of ``parent``; None where absent."""
    owner: nn.Module | None = parent
    *heads, last = path.split(".")
    for h in heads:
        owner = getattr(owner, h, None)
        if not isinstance(owner, nn.Module):
            return None, last, None
    return owner, last, getattr(owner, last, None)


def fuse_projections_(model: nn.Module, groups: tuple[tuple[str, ...], ...] = DEFAULT_GROUPS) -> list[str]:
    """Fuse every group of sibling projections of ``model`` in place.

    Args:
        model: any module tree (a Hugging Face causal LM, a decoder layer...).
        groups: child-name tuples to fuse when all are present on one parent and each is an
            ``nn.Linear`` or ``FactorizedLinear`` of the same ``in_features``; a dotted name
            (``k_proj.down``) is a child of a child, replaced where it sits.

    Returns:
        The qualified names of the fused groups (``model.layers.0.self_attn:q_proj+k_proj+v_proj``).
    """
    done: list[str] = []
    for pname, parent in list(model.named_modules()):
        for names in groups:
            found = [_member(parent, n) for n in names]
            members = [m for _, _, m in found]
            if not all(isinstance(m, (nn.Linear, FactorizedLinear)) for m in members):
                continue
            if len({m.in_features for m in members}) != 1:
                continue
            attr = "fused_" + "_".join(n.split(".")[0].removesuffix("_proj") for n in names)
            if attr in parent._modules:
                continue
            group = FusedInputProjection(members)
            setattr(parent, attr, group)
            for i, ((owner, name, _), m) in enumerate(zip(found, members, strict=True)):
                setattr(owner, name, FusedSlice(group, i, m))
            done.append(f"{pname}:{'+'.join(names)}")
    return done


def unfuse_projections_(model: nn.Module) -> int:
    """Undo :func:`fuse_projections_`: put stand-alone modules back. Returns the groups undone."""
    for owner in list(model.modules()):
        for k, v in list(owner._modules.items()):
            if isinstance(v, FusedSlice):
                setattr(owner, k, v.to_original())
    n = 0
    for parent in list(model.modules()):
        for k in [k for k, v in parent._modules.items() if isinstance(v, FusedInputProjection)]:
            delattr(parent, k)
            n += 1
    return n
