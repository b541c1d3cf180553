"""Exact dimension repair: zero-pad every misaligned dim of a model so that its outputs do not change.

``repair_(model, strategy)`` pads, in place:

* **hidden size** (the residual stream): zero embedding columns, zero output rows of ``o``/``down``,
  zero input columns of ``q/k/v/gate/up`` and ``lm_head``; every RMSNorm over the hidden size gets
  ``weight * sqrt(d/d_pad)`` and ``eps * d/d_pad`` so that it normalizes exactly as before;
* **MLP intermediate width** (per layer): zero rows of ``gate``/``up``, zero columns of ``down``
  (``SiLU(0) * 0 = 0``);
* **attention head_dim**: q/k heads are laid out ``[h0, 0, h1, 0]`` (the two RoPE halves padded
  separately, so every rotary pair ``(i, i + d/2)`` stays a pair), the rotary inverse frequencies of
  the original pairs are kept, the softmax scale stays ``1/sqrt(d)``, v heads are padded at the end
  with the matching zero columns of ``o``; Qwen3's q/k RMSNorms are compensated like the hidden norms;
* **factorized inner ranks** (:class:`~gac.nn.FactorizedLinear`): zero rows of ``v``,
  zero columns of ``u``.

The vocabulary is reported but not padded: extra logits would change the output distribution.

Strategies: ``minimal`` pads to multiples of 8, ``optimal`` to 16, ``profile`` to the profile's
modulus of each operator class that the dim feeds (the least common multiple when it feeds several).

Saving: :func:`save_repaired` writes a Hugging Face directory plus ``gac_repair.json``, which records
what the config cannot express (attention scales, norm eps, rotary frequencies, module shapes);
:func:`load_repaired` (also reached through :func:`gac.models.load_model`) re-installs it.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gac import __version__
from gac.alignment import round_up
from gac.errors import GacError, check_schema
from gac.hardware.profile import Profile, load_profile
from gac.models.adapters import FamilyAdapter, get_adapter, in_features, is_rms_norm, out_features
from gac.nn import FactorizedLinear, replace_module
from gac.nn.latent import latent_modules
from gac.surgery.latent_attention import pad_latent_rank_
from gac.surgery.padding import (
    head_end_placement,
    pad_embedding_,
    pad_in_,
    pad_out_,
    pad_rank_,
    pad_rmsnorm_,
    rope_head_placement,
)

STRATEGIES: tuple[str, ...] = ("minimal", "optimal", "profile")
SCHEMA = "gac.repair/1"
#: operator classes that each kind of dim feeds (its target is aligned for all of them)
DIM_OPS: dict[str, tuple[str, ...]] = {
    "hidden": ("gemm_k", "gemm_n"),
    "intermediate": ("gemm_n", "gemm_k"),
    "head_dim": ("sdpa_head_dim",),
    "rank": ("lowrank_r",),
}
_STATIC_ROPE = ("default", "linear", "llama3", "yarn", "longrope")


@dataclass
class DimChange:
    """One padded dim: ``kind`` (hidden, intermediate, head_dim, rank) at ``where`` (a module or ``model``)."""

    kind: str
    where: str
    before: int
    after: int


@dataclass
class RepairReport:
    """What :func:`repair_` did.

    Attributes:
        strategy: minimal, optimal or profile.
        profile: id of the profile used for targets (``profile`` strategy) and the speed prediction.
        changes: every padded dim.
        skipped: dims left misaligned, each with the reason.
        params_before / params_after: parameter counts (tied weights counted once).
        predicted_speedup: predicted latency of the linear + attention kernels before / after, for a
            prefill of ``tokens`` tokens, from the profile (1.0 when nothing changed).
        tokens: prefill length of that prediction.
    """

    strategy: str
    profile: str
    changes: list[DimChange] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    params_before: int = 0
    params_after: int = 0
    predicted_speedup: float = 1.0
    tokens: int = 2048
    notes: list[str] = field(default_factory=list)

    @property
    def noop(self) -> bool:
        return not self.changes

    @property
    def dims_changed(self) -> int:
        return len(self.changes)

    @property
    def memory_overhead_pct(self) -> float:
        if not self.params_before:
            return 0.0
        return 100.0 * (self.params_after - self.params_before) / self.params_before

    def summary(self) -> str:
        """One human line."""
        if self.noop:
            return f"already aligned under the {self.strategy} strategy: nothing to repair (no-op)"
        kinds = sorted({c.kind for c in self.changes})
        return (
            f"padded {self.dims_changed} dims ({', '.join(kinds)}) with strategy {self.strategy}: "
            f"+{self.memory_overhead_pct:.2f}% parameters, predicted speedup {self.predicted_speedup:.2f}x "
            f"(profile {self.profile}, {self.tokens}-token prefill)"
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["noop"] = self.noop
        d["dims_changed"] = self.dims_changed
        d["memory_overhead_pct"] = self.memory_overhead_pct
        return d


# ----------------------------------------------------------------------------- targets


def target_modulus(strategy: str, kind: str, profile: Profile | None = None) -> int:
    """The modulus a dim of ``kind`` is padded to under ``strategy``."""
    if strategy == "minimal":
        m = 8
    elif strategy == "optimal":
        m = 16
    elif strategy == "profile":
        if profile is None:
            raise GacError("strategy 'profile' needs a profile")
        m = 1
        for op in DIM_OPS[kind]:
            m = math.lcm(m, profile.modulus(op))
    else:
        raise GacError(f"unknown repair strategy {strategy!r}; choose one of: {', '.join(STRATEGIES)}")
    if kind == "head_dim":
        m = math.lcm(m, 2)  # RoPE halves
    return m


def param_count(model: nn.Module) -> int:
    """Parameters, tied weights counted once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _rope_ok(model: nn.Module, ad: FamilyAdapter) -> str | None:
    """None when head_dim can be padded, else the reason why not."""
    try:
        rot = model.get_submodule(ad.rotary_fqn)
    except AttributeError:
        return "no rotary embedding module found"
    if ad.fused_qkv and ad.qkv_layout != "blocked":
        return f"the fused qkv of {ad.family} is {ad.qkv_layout} per head, which head_dim padding does not handle"
    rt = getattr(rot, "rope_type", "default")
    if isinstance(rt, dict) or rt not in _STATIC_ROPE:
        return f"RoPE type {rt!r} recomputes its frequencies at run time"
    inv = getattr(rot, "inv_freq", None)
    if inv is None or 2 * inv.numel() != ad.head_dim:
        return "partial rotary embeddings are not supported"
    return None


# ----------------------------------------------------------------------------- latency model


def predicted_latency_ms(model: nn.Module, profile: Profile, tokens: int = 2048) -> float:
    """Predicted time (ms) of every projection GEMM and every attention call for a ``tokens`` prefill.

    GEMMs use :meth:`Profile.gemm_ms` (factorized layers as two GEMMs, the inner rank under
    ``lowrank_r``); attention is ``4 * tokens^2 * heads * head_dim`` FLOPs slowed by the profile's
    ``sdpa_head_dim`` efficiency.  Only ratios of this number are meaningful.
    """
    ad = get_adapter(model)
    total = 0.0
    for _, _, fqn in ad.all_projections():
        total += _module_ms(model.get_submodule(fqn), profile, tokens)
    head = model.get_submodule(ad.lm_head_fqn)
    total += _module_ms(head, profile, tokens)
    peak = max(profile.rule("gemm_n").curve.get("tflops") or [100.0])
    hd = ad.head_dim
    flops = 4.0 * tokens * tokens * ad.heads * hd * ad.num_layers
    total += flops / (peak * 1e12 * profile.efficiency("sdpa_head_dim", hd)) * 1e3
    return total


def _module_ms(mod: nn.Module, profile: Profile, m: int) -> float:
    if isinstance(mod, FactorizedLinear):
        return profile.gemm_ms(m, mod.in_features, mod.rank, op="lowrank_r") + profile.gemm_ms(
            m, mod.rank, mod.out_features, op="gemm_n"
        )
    return profile.gemm_ms(m, in_features(mod), out_features(mod), op="gemm_n")


# ----------------------------------------------------------------------------- repair


def repair_(
    model: nn.Module,
    strategy: str = "minimal",
    profile: Profile | str | None = None,
    tokens: int = 2048,
) -> RepairReport:
    """Zero-pad every misaligned dim of ``model`` in place; the outputs stay the same.

    Args:
        model: a causal LM of a supported family (see :mod:`gac.models.adapters`).
        strategy: ``minimal`` (multiples of 8), ``optimal`` (16) or ``profile`` (the profile's rules).
        profile: a :class:`Profile` or a spec for :func:`load_profile` (default: auto).
        tokens: prefill length for the predicted speedup.

    Returns:
        A :class:`RepairReport` (``noop`` when everything was aligned already).

    Raises:
        GacError: unknown strategy, unsupported architecture, or misaligned dims of which none can
            be padded.
    """
    if strategy not in STRATEGIES:
        raise GacError(f"unknown repair strategy {strategy!r}; choose one of: {', '.join(STRATEGIES)}")
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    ad = get_adapter(model)
    if ad.num_layers == 0:
        raise GacError(f"the model has no compressible dims: a {ad.family} model without decoder layers")
    report = RepairReport(strategy=strategy, profile=prof.id, tokens=tokens)
    report.params_before = param_count(model)
    t_before = predicted_latency_ms(model, prof, tokens)
    # all checks before any change, so a refusal leaves the model untouched
    plan = _plan_repair(model, ad, strategy, prof, report)
    if not _planned(plan):
        report.params_after = report.params_before
        return report
    _apply_repair(model, ad, plan, report)
    report.params_after = param_count(model)
    t_after = predicted_latency_ms(model, prof, tokens)
    report.predicted_speedup = t_before / t_after if t_after > 0 else 1.0
    return report


def _plan_repair(
    model: nn.Module, ad: FamilyAdapter, strategy: str, prof: Profile, report: RepairReport
) -> dict:
    """What to pad, ``{dim kind: (d, d_new) or {where: (d, d_new)}}``; what cannot be goes to ``report.skipped``.

    Raises:
        GacError: misaligned dims of which none can be padded.
    """

    def target(kind: str, d: int) -> int:
        return round_up(d, target_modulus(strategy, kind, prof))

    plan: dict[str, Any] = {}
    h = ad.hidden
    if target("hidden", h) != h:
        ln = [f for f in ad.hidden_norm_fqns() if not is_rms_norm(model.get_submodule(f))]
        if ln:
            report.skipped.append(
                f"hidden {h}: {ln[0]} is a LayerNorm (mean-centred), which zero channels would change"
            )
        else:
            plan["hidden"] = (h, target("hidden", h))
    inter = {
        i: (ad.intermediate(i), target("intermediate", ad.intermediate(i))) for i in range(ad.num_layers)
    }
    plan["intermediate"] = {i: v for i, v in inter.items() if v[0] != v[1]}
    hd = ad.head_dim
    if target("head_dim", hd) != hd:
        why = _rope_ok(model, ad)
        if why is None:
            plan["head_dim"] = (hd, target("head_dim", hd))
        else:
            report.skipped.append(f"head_dim {hd}: {why}")
    ranks = {
        n: (m.rank, target("rank", m.rank))
        for n, m in model.named_modules()
        if isinstance(m, FactorizedLinear)
    }
    plan["rank"] = {n: v for n, v in ranks.items() if v[0] != v[1]}
    latent = latent_modules(model)
    plan["latent"] = {}
    rank_mod = target_modulus(strategy, "rank", prof)
    for n, m in latent:
        for kind, proj in (("k", m.k_proj), ("v", m.v_proj)):
            for g, r in enumerate(proj.ranks):
                mod = rank_mod
                if kind == "k" and strategy == "profile":  # rebuilt keys: also the decode kernel's rank tile
                    k = m.key_group_shape(g)
                    mod = prof.key_rank_modulus(mod, k["key_group"], k["query_rows"], k["width"])
                if round_up(r, mod) != r:
                    plan["latent"][(n, kind, g)] = (r, round_up(r, mod))
    if latent:  # PaLU models: only the latent ranks are repaired here
        for key in ("hidden", "head_dim"):
            if plan.pop(key, None) is not None:
                report.skipped.append(f"{key}: not padded in a latent-attention (PaLU) model")
    unrepairable = list(report.skipped)
    v = ad.vocab
    if round_up(v, target_modulus(strategy, "hidden", prof)) != v:
        report.skipped.append(f"vocab {v}: not padded (extra logits would change the output distribution)")
    if unrepairable and not _planned(plan):
        raise GacError(
            "no repairable dims: the misaligned dims cannot be zero-padded exactly ("
            + "; ".join(unrepairable)
            + ")"
        )
    return plan


def _planned(plan: dict[str, Any]) -> bool:
    return bool(
        plan.get("hidden") or plan["intermediate"] or plan.get("head_dim") or plan["rank"] or plan["latent"]
    )


def _apply_repair(model: nn.Module, ad: FamilyAdapter, plan: dict[str, Any], report: RepairReport) -> None:
    """Pad what :func:`_plan_repair` planned, in place, recording each change in ``report``."""
    for name, (r, r_new) in plan["rank"].items():
        pad_rank_(model.get_submodule(name), r_new)
        report.changes.append(DimChange("rank", name, r, r_new))
    for (name, kind, g), (r, r_new) in plan["latent"].items():
        pad_latent_rank_(model.get_submodule(name), kind, g, r_new)
        report.changes.append(DimChange("latent_rank", f"{name}.{kind}_proj:g{g}", r, r_new))
    for i, (d, d_new) in plan["intermediate"].items():
        _pad_intermediate(model, ad, i, d, d_new)
        report.changes.append(DimChange("intermediate", ad.mlp_fqn(i), d, d_new))
    if "head_dim" in plan:
        d, d_new = plan["head_dim"]
        why = _pad_head_dim(model, ad, d, d_new)
        report.changes.append(DimChange("head_dim", "model", d, d_new))
        if why is not None:
            report.notes.append(f"head_dim {d} -> {d_new} needs gac's loader: {why}")
    if "hidden" in plan:
        d, d_new = plan["hidden"]
        _pad_hidden(model, ad, d, d_new)
        report.changes.append(DimChange("hidden", "model", d, d_new))
    _sync_config(model, ad)


def _pad_intermediate(model: nn.Module, ad: FamilyAdapter, i: int, d: int, d_new: int) -> None:
    """Pad layer ``i``'s MLP intermediate dim ``d -> d_new``: zero rows in, zero columns out."""
    p = ad.projections(i)
    if "gate_up" in p:  # fused [gate | up]: each half grows separately
        halves = torch.cat([torch.arange(d), d_new + torch.arange(d)])
        pad_out_(model.get_submodule(p["gate_up"]), 2 * d_new, halves)
    for role in ("gate", "up"):  # fc1/fc2 MLPs have "up" only: act(0) = 0 keeps the zeros
        if role in p:
            pad_out_(model.get_submodule(p[role]), d_new)
    pad_in_(model.get_submodule(p["down"]), d_new)
    mlp = model.get_submodule(ad.mlp_fqn(i))
    if hasattr(mlp, "intermediate_size"):
        mlp.intermediate_size = d_new


def _pad_head_dim(model: nn.Module, ad: FamilyAdapter, d: int, d_new: int) -> str | None:
    """Pad head_dim ``d -> d_new``; returns None when the result is expressible by a plain config
    (``rope_theta' = rope_theta^(d'/d)``, q scaled by ``sqrt(d'/d)``), else why it needs gac's loader."""
    nq, nkv = ad.heads, ad.kv_heads
    rot = model.get_submodule(ad.rotary_fqn)
    inv = rot.inv_freq
    plain = _plain_rope(model, ad, rot, d, d_new)
    why = plain if isinstance(plain, str) else None
    gain = (d_new / d) ** 0.5
    for i in range(ad.num_layers):
        p = ad.projections(i)
        q_rows = None
        if "qkv" in p:  # blocked [q | k | v] (interleaved layouts are refused by _rope_ok)
            placement = torch.cat(
                [
                    rope_head_placement(nq, d, d_new),
                    nq * d_new + rope_head_placement(nkv, d, d_new),
                    (nq + nkv) * d_new + head_end_placement(nkv, d, d_new),
                ]
            )
            pad_out_(model.get_submodule(p["qkv"]), (nq + 2 * nkv) * d_new, placement)
            q_rows = nq * d_new
        else:
            pad_out_(model.get_submodule(p["q"]), nq * d_new, rope_head_placement(nq, d, d_new))
            pad_out_(model.get_submodule(p["k"]), nkv * d_new, rope_head_placement(nkv, d, d_new))
            pad_out_(model.get_submodule(p["v"]), nkv * d_new, head_end_placement(nkv, d, d_new))
        pad_in_(model.get_submodule(p["o"]), nq * d_new, head_end_placement(nq, d, d_new))
        for f in ad.qk_norm_fqns(i):  # per head (Qwen3) or over all heads (OLMo-2)
            norm = model.get_submodule(f)
            n = norm.weight.numel() // d
            pad_rmsnorm_(norm, n * d_new, rope_head_placement(n, d, d_new))
        attn = model.get_submodule(ad.attention_fqn(i))
        if why is None:
            # softmax scale 1/sqrt(d) = (q * sqrt(d'/d)) . k / sqrt(d'): fold the gain into q (or q's norm)
            qn = [f for f in ad.qk_norm_fqns(i) if f.rpartition(".")[2].startswith("q")]
            target = model.get_submodule(qn[0]) if qn else model.get_submodule(p.get("q") or p["qkv"])
            _scale_out_(target, gain, None if qn else q_rows)
            attn.scaling = d_new**-0.5
        else:
            attn.scaling = float(getattr(attn, "scaling", d**-0.5))  # keep 1/sqrt(d), not 1/sqrt(d_new)
        attn.head_dim = d_new
    if why is None:
        new_cfg, new_inv = plain
        model.config.rope_parameters = new_cfg.rope_parameters
        if hasattr(new_cfg, "rope_theta") and not isinstance(
            getattr(type(new_cfg), "rope_theta", None), property
        ):
            with contextlib.suppress(AttributeError):
                model.config.rope_theta = new_cfg.rope_theta
        _set_inv_freq(rot, new_inv.to(dtype=inv.dtype, device=inv.device))
        return None
    new_inv = torch.zeros(d_new // 2, dtype=inv.dtype, device=inv.device)
    new_inv[: inv.numel()] = inv  # original pairs keep their frequencies; padded pairs hold zeros
    _set_inv_freq(rot, new_inv)
    return why


def _scale_out_(mod: nn.Module, gain: float, rows: int | None = None) -> None:
    """Multiply a module's output (its first ``rows`` outputs when given) by ``gain``: a Linear's
    weight and bias, a factorized layer's ``u``, or a norm's weight."""
    mod = getattr(mod, "u", mod)  # FactorizedLinear: the output side
    with torch.no_grad():
        for name in ("weight", "bias"):
            t = getattr(mod, name, None)
            if isinstance(t, torch.Tensor):
                part = t if rows is None else t[:rows]
                part.copy_((part.double() * gain).to(t.dtype))


def _plain_rope(model: nn.Module, ad: FamilyAdapter, rot: nn.Module, d: int, d_new: int) -> Any:
    """``(config, inv_freq)`` of a config with head_dim ``d_new`` whose rotary embedding keeps every
    original frequency exactly (``rope_theta' = rope_theta^(d'/d)``), or a string saying why none does."""
    import copy

    cfg = model.config
    rp = getattr(cfg, "rope_parameters", None)
    if not isinstance(rp, dict) or "rope_theta" not in rp:
        return "the config has no single rope_parameters['rope_theta'] to rescale"
    attn = model.get_submodule(ad.attention_fqn(0))
    if abs(float(getattr(attn, "scaling", d**-0.5)) - d**-0.5) > 1e-12 * d**-0.5:
        return "the attention scale is not 1/sqrt(head_dim)"
    new = copy.deepcopy(cfg)
    new.head_dim = d_new
    new.rope_parameters = {**rp, "rope_theta": float(rp["rope_theta"]) ** (d_new / d)}
    try:
        fresh = type(rot)(config=new)
    except Exception as e:  # noqa: BLE001 - any refusal means "no exact config"
        return f"the rotary embedding cannot be rebuilt for head_dim {d_new} ({type(e).__name__})"
    old_inv = rot.inv_freq.detach().double().cpu()
    new_inv = fresh.inv_freq.detach().double().cpu()
    if new_inv.numel() != d_new // 2 or not torch.allclose(
        new_inv[: old_inv.numel()], old_inv, rtol=1e-6, atol=0
    ):
        rt = rp.get("rope_type", "default")
        return f"RoPE type {rt!r} has no rope_theta that keeps the original frequencies at head_dim {d_new}"
    if (
        abs(float(getattr(fresh, "attention_scaling", 1.0)) - float(getattr(rot, "attention_scaling", 1.0)))
        > 1e-12
    ):
        return "the rotary attention scaling depends on head_dim"
    return new, fresh.inv_freq.detach().float()


def _set_inv_freq(rot: nn.Module, inv: torch.Tensor) -> None:
    rot.register_buffer("inv_freq", inv.clone(), persistent=False)
    if hasattr(rot, "original_inv_freq"):
        rot.register_buffer("original_inv_freq", inv.clone(), persistent=False)


def _pad_hidden(model: nn.Module, ad: FamilyAdapter, d: int, d_new: int) -> None:
    tied = ad.tied_embeddings
    emb = model.get_submodule(ad.embed_fqn)
    pad_embedding_(emb, d_new)
    for i in range(ad.num_layers):
        p = ad.projections(i)
        for role in ("q", "k", "v", "qkv", "gate", "up", "gate_up"):
            if role in p:
                pad_in_(model.get_submodule(p[role]), d_new)
        for role in ("o", "down"):
            pad_out_(model.get_submodule(p[role]), d_new)
    for f in ad.hidden_norm_fqns():
        pad_rmsnorm_(model.get_submodule(f), d_new)
    head = model.get_submodule(ad.lm_head_fqn)
    if tied:
        head.weight = emb.weight
        head.in_features = d_new
    else:
        pad_in_(head, d_new)


def _sync_config(model: nn.Module, ad: FamilyAdapter) -> None:
    """Make the HF config describe the padded shapes (so that ``from_pretrained`` rebuilds them)."""
    cfg = model.config
    cfg.hidden_size = ad.hidden
    cfg.head_dim = ad.head_dim
    inter = {ad.intermediate(i) for i in range(ad.num_layers)}
    cfg.intermediate_size = max(inter)
    eps = {
        m.variance_epsilon for m in model.modules() if isinstance(getattr(m, "variance_epsilon", None), float)
    }
    if len(eps) == 1 and hasattr(cfg, "rms_norm_eps"):
        cfg.rms_norm_eps = eps.pop()  # hidden padding scales every norm's eps by d/d_pad


def plain_mismatch(model: nn.Module, config_dir: str | Path) -> str | None:
    """None when ``AutoModelForCausalLM.from_pretrained(config_dir)`` (config only, no gac) rebuilds
    ``model``'s runtime state exactly (attention scales, norm eps, rotary frequencies, module shapes);
    else the first difference, in words."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        from transformers.initialization import no_init_weights
    except ImportError:
        no_init_weights = contextlib.nullcontext
    try:
        config = AutoConfig.from_pretrained(str(config_dir))
    except (OSError, ValueError) as e:
        return f"config.json does not load ({str(e).splitlines()[0]})"
    try:
        with no_init_weights():
            fresh = AutoModelForCausalLM.from_config(config)
    except Exception as e:  # noqa: BLE001 - any refusal means "not plain"
        return f"transformers cannot build the model from config.json ({type(e).__name__})"
    want, got = runtime_state(model), runtime_state(fresh)
    for name, s in want["attention_scaling"].items():
        if abs(got["attention_scaling"].get(name, float("nan")) - s) > 1e-9 * abs(s):
            return f"attention scale of {name} differs from the config's"
    for name, e in want["norm_eps"].items():
        if abs(got["norm_eps"].get(name, float("nan")) - e) > 1e-9 * abs(e) + 1e-30:
            return f"eps of {name} differs from the config's rms_norm_eps"
    a, b = torch.tensor(want["inv_freq"]), torch.tensor(got["inv_freq"])
    if a.shape != b.shape or not torch.allclose(a, b, rtol=1e-6, atol=0):
        return "the rotary frequencies are not those the config gives"
    for name, spec in want["modules"].items():
        if got["modules"].get(name) != spec:
            return f"{name} has a shape the config cannot express ({spec['type']} {spec.get('out')}x{spec['in']})"
    return None


# ----------------------------------------------------------------------------- save / load


def runtime_state(model: nn.Module) -> dict[str, Any]:
    """What a padded model needs beyond its config and weights: per-module attention scales and
    norm eps, the rotary inverse frequencies, and the shapes of non-standard modules."""
    ad = get_adapter(model)
    scaling = {}
    for i in range(ad.num_layers):
        attn = model.get_submodule(ad.attention_fqn(i))
        if hasattr(attn, "scaling"):
            scaling[ad.attention_fqn(i)] = float(attn.scaling)
    eps = {}
    for name, mod in model.named_modules():
        e = getattr(mod, "variance_epsilon", None)
        if isinstance(e, float):
            eps[name] = e
    rot = model.get_submodule(ad.rotary_fqn)
    modules = {}
    for name, mod in model.named_modules():
        if isinstance(mod, FactorizedLinear):
            modules[name] = {
                "type": "factorized",
                "in": mod.in_features,
                "rank": mod.rank,
                "out": mod.out_features,
                "bias": mod.bias is not None,
            }
        elif isinstance(mod, nn.Linear):
            modules[name] = {
                "type": "linear",
                "in": mod.in_features,
                "out": mod.out_features,
                "bias": mod.bias is not None,
            }
    return {
        "attention_scaling": scaling,
        "norm_eps": eps,
        "inv_freq": [float(x) for x in rot.inv_freq.detach().float().cpu()],
        "modules": modules,
    }


def apply_runtime_state(model: nn.Module, state: dict[str, Any]) -> None:
    """Re-install what :func:`runtime_state` recorded (after the weights are loaded)."""
    for name, s in state.get("attention_scaling", {}).items():
        model.get_submodule(name).scaling = float(s)
    for name, e in state.get("norm_eps", {}).items():
        model.get_submodule(name).variance_epsilon = float(e)
    if state.get("inv_freq"):
        ad = get_adapter(model)
        rot = model.get_submodule(ad.rotary_fqn)
        _set_inv_freq(rot, torch.tensor(state["inv_freq"], dtype=torch.float32, device=rot.inv_freq.device))


def save_repaired(
    model: nn.Module,
    out: str | Path,
    report: RepairReport | None = None,
    tokenizer: Any = None,
    overwrite: bool = False,
    source: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` as a Hugging Face directory plus ``gac_repair.json``, atomically.

    Load it back with :func:`load_repaired` or :func:`gac.models.load_model`.
    """
    from gac.utils import atomic_dir

    out = Path(out)
    if latent_modules(model):  # PaLU: a gac directory (its latent attention needs gac's skeleton)
        from gac import io

        meta = dict(getattr(model, "gac_config", {}) or {})
        for k in (
            "schema",
            "gac_version",
            "torch_version",
            "architecture",
            "factorized",
            "modules",
            "pruned",
            "tied",
            "dtype",
        ):
            meta.pop(k, None)
        meta.update(repair=report.to_dict() if report is not None else None, repair_source=source or {})
        return io.save(model, out, meta, tokenizer=tokenizer, overwrite=overwrite)
    cfg = model.config
    overrides = {k: getattr(cfg, k) for k in ("hidden_size", "head_dim", "intermediate_size")}
    saved_hidden = _valid_hidden_for_config(cfg)
    with atomic_dir(out, overwrite=overwrite) as tmp:
        try:
            cfg.hidden_size = saved_hidden
            model.save_pretrained(tmp)
        finally:
            cfg.hidden_size = overrides["hidden_size"]
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        doc = {
            "schema": SCHEMA,
            "gac_version": __version__,
            "source": source or {},
            "report": report.to_dict() if report is not None else None,
            "config_overrides": overrides,
            "runtime": runtime_state(model),
        }
        why = plain_mismatch(model, tmp)
        doc["plain_transformers"] = why is None
        if why is not None:
            doc["plain_transformers_why_not"] = why
        (tmp / "gac_repair.json").write_text(json.dumps(doc, indent=1))
    return out


def _valid_hidden_for_config(cfg: Any) -> int:
    """The hidden size to write into config.json.

    Some configs (Llama) refuse ``hidden_size % num_attention_heads != 0`` even when ``head_dim`` is
    explicit.  Then config.json gets the largest valid value below the padded one and the real width
    is restored from ``gac_repair.json``'s ``config_overrides`` (a plain ``from_pretrained`` fails
    loudly on the shape mismatch instead of loading a wrong model).
    """
    h = int(cfg.hidden_size)
    validate = getattr(cfg, "validate", None)
    if validate is None:
        return h
    try:
        validate()
        return h
    except Exception:  # noqa: BLE001 - any validator refusal
        heads = int(cfg.num_attention_heads)
        return max(heads, (h // heads) * heads)


def _needs_skeleton(model: nn.Module, modules: dict[str, Any]) -> bool:
    for name, spec in modules.items():
        try:
            mod = model.get_submodule(name)
        except AttributeError:
            return True
        if spec["type"] == "factorized" and not isinstance(mod, FactorizedLinear):
            return True
        if spec["type"] == "linear" and (
            not isinstance(mod, nn.Linear) or (mod.in_features, mod.out_features) != (spec["in"], spec["out"])
        ):
            return True
    return False


def load_repaired(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> nn.Module:
    """Load a directory written by :func:`save_repaired`, with its runtime state re-installed."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    try:
        doc = json.loads((path / "gac_repair.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise GacError(f"{path} has no readable gac_repair.json: {e}") from None
    check_schema(doc.get("schema"), SCHEMA, path / "gac_repair.json")
    state = doc["runtime"]
    config = AutoConfig.from_pretrained(str(path))
    for k, val in (doc.get("config_overrides") or {}).items():
        setattr(config, k, val)
    modules = state.get("modules", {})
    if doc.get("plain_transformers") or not any(m["type"] == "factorized" for m in modules.values()):
        # transformers' own loader (it knows each family's checkpoint key names), then gac's runtime state
        try:
            from gac.utils import quiet_hf

            with quiet_hf():
                model = AutoModelForCausalLM.from_pretrained(str(path), config=config, dtype=dtype)
        except Exception:  # noqa: BLE001 - shapes the config cannot express: build the skeleton below
            model = None
        if model is not None and not _needs_skeleton(model, modules):
            apply_runtime_state(model, state)
            return model.to(device=device, dtype=dtype).eval()
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older layouts: initialise (slower, same result after loading)
        no_init_weights = contextlib.nullcontext
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if _needs_skeleton(model, modules):
        for name, spec in modules.items():
            if spec["type"] == "factorized":
                new: nn.Module = FactorizedLinear(
                    spec["in"], spec["rank"], spec["out"], bias=spec["bias"], dtype=dtype
                )
            else:
                new = nn.Linear(spec["in"], spec["out"], bias=spec["bias"], dtype=dtype)
            replace_module(model, name, new)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise GacError(f"{path} has no .safetensors weights")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    ad = get_adapter(model)
    allowed_missing = {f"{ad.lm_head_fqn}.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    bad_missing = [k for k in missing if k not in allowed_missing]
    if bad_missing or unexpected:
        raise GacError(
            f"{path}: weights do not match the recorded shapes (missing {bad_missing[:3]}, unexpected {list(unexpected)[:3]})"
        )
    if allowed_missing & set(missing):
        model.get_submodule(ad.lm_head_fqn).weight = model.get_submodule(ad.embed_fqn).weight
    for i in range(ad.num_layers):
        model.get_submodule(ad.attention_fqn(i)).head_dim = int(config.head_dim)
    apply_runtime_state(model, state)
    return model.to(device=device, dtype=dtype).eval()
