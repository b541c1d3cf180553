"""The inference sweep on CPU: grid, statistics, OOM and error handling, outputs."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from gac.compat import cache_arg
from gac.errors import GacError
from gac.eval import infer
from gac.eval.infer import SweepConfig, Variant, run_sweep, weight_bytes_per_step, write_results
from gac.nn import FactorizedLinear, replace_module
from gac.runtime.step import DecodeStep, compile_step, resolve_fast_path
from gac.testing import tiny_model

TINY = SweepConfig(
    prefill_batches=(1, 2),
    prefill_seqs=(8, 16),
    decode_batches=(1, 3),
    decode_kv=(16,),
    prefill_warmup=1,
    prefill_reps=3,
    decode_warmup=2,
    decode_reps=4,
)


def _lowrank():
    m = tiny_model("llama")
    for n in [n for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear) and "mlp" in n]:
        lin = m.get_submodule(n)
        replace_module(m, n, FactorizedLinear(lin.in_features, 13, lin.out_features))
    return m


def test_cpu_sweep_writes_json_csv_plots_and_speedups(tmp_path):
    res = run_sweep([Variant("dense", tiny_model), Variant("lowrank", _lowrank)], TINY, "cpu")
    assert res["schema"] == "gac.infer/1" and res["baseline"] == "dense"
    assert res["copy_bandwidth"]["status"] == "skipped"
    for name in ("dense", "lowrank"):
        v = res["variants"][name]
        assert [(r["batch"], r["seq"]) for r in v["prefill"]] == [(1, 8), (1, 16), (2, 8), (2, 16)]
        assert [(r["batch"], r["kv"]) for r in v["decode"]] == [(1, 16), (3, 16)]
        for r in v["prefill"] + v["decode"]:
            assert r["status"] == "ok" and r["reps"] in (3, 4)
            assert r["min_ms"] <= r["q25_ms"] <= r["median_ms"] <= r["q75_ms"]
        d = v["decode"][1]
        assert d["tokens_per_s"] == pytest.approx(3 / (d["median_ms"] * 1e-3))
        # KV bytes: layers x (K + V) x batch x kv_heads x kv x head_dim x 4 bytes
        assert d["kv_bytes"] == 2 * 2 * 3 * 1 * 16 * 24 * 4
        assert v["kernels"]["decode"]["sdpa_backend"] != "unknown"
        assert any("mm" in k["name"] for k in v["kernels"]["decode"]["gemm_kernels"])
    lr = res["variants"]["lowrank"]
    assert lr["params"] < res["variants"]["dense"]["params"]
    d0 = lr["decode"][0]
    ideal = (res["variants"]["dense"]["weight_bytes_per_step"] + d0["kv_bytes"]) / (
        lr["weight_bytes_per_step"] + d0["kv_bytes"]
    )
    assert d0["bytes_ideal_speedup"] == pytest.approx(ideal)
    write_results(res, tmp_path)
    assert json.loads((tmp_path / "infer.json").read_text())["variants"]["lowrank"]["params"] == lr["params"]
    rows = list(csv.DictReader((tmp_path / "infer.csv").open()))
    assert len(rows) == 2 * (4 + 2) and {r["variant"] for r in rows} == {"dense", "lowrank"}
    assert (tmp_path / "prefill_latency.png").stat().st_size > 1000
    assert (tmp_path / "decode_tps.png").stat().st_size > 1000


def test_a_decode_only_grid_times_decode_and_names_its_kernels():
    # a plan may time decode alone (prefill_batches = []): the kernel summary has no prefill part
    cfg = SweepConfig(**{**TINY.to_dict(), "prefill_batches": (), "prefill_seqs": (), "decode_batches": (2,)})
    v = run_sweep([Variant("dense", tiny_model)], cfg, "cpu")["variants"]["dense"]
    assert v["prefill"] == [] and [(r["batch"], r["status"]) for r in v["decode"]] == [(2, "ok")]
    assert set(v["kernels"]) == {"decode"} and v["kernels"]["decode"]["batch"] == 2


def test_each_point_records_its_peak_and_its_timed_calls_peak_apart():
    # a point's peak (compile, autotune and capture included) and its timed calls' peak alone: off CUDA neither
    v = run_sweep([Variant("dense", tiny_model)], TINY, "cpu")["variants"]["dense"]
    for r in v["prefill"] + v["decode"]:
        assert r["peak_mem_gib"] is None and r["steady_peak_mem_gib"] is None, r
    assert infer._peaks(5.5, 5.25) == {"peak_mem_gib": 5.5, "steady_peak_mem_gib": 5.25}
    assert infer._peaks(5.0, 5.25) == {"peak_mem_gib": 5.25, "steady_peak_mem_gib": 5.25}
    assert infer._peaks(None, None) == {"peak_mem_gib": None, "steady_peak_mem_gib": None}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_point_s_timed_calls_peak_lies_between_what_it_held_and_its_whole_peak():
    cfg = SweepConfig(**{**TINY.to_dict(), "profile_kernels": False, "decode_batches": (2,)})
    v = run_sweep([Variant("dense", lambda: tiny_model("llama").cuda())], cfg, "cuda")["variants"]["dense"]
    for r in v["prefill"]:
        assert 0 < r["steady_peak_mem_gib"] <= r["peak_mem_gib"], r
    for r in v["decode"]:
        assert r["held_before_gib"] <= r["steady_peak_mem_gib"] <= r["peak_mem_gib"], r


def test_each_decode_point_records_the_dense_decode_attention_it_took(monkeypatch):
    from gac.kernels import attention

    cfg = SweepConfig(
        **{**TINY.to_dict(), "prefill_batches": (), "prefill_seqs": (), "decode_batches": (1, 3)}
    )
    monkeypatch.setattr(attention, "DECODE_MODE", "auto")
    monkeypatch.setattr(attention, "MATMUL_MAX_KV", 0)
    monkeypatch.setattr(attention, "MATMUL_MAX_CTAS", 2)  # B1 x 1 KV head: the GEMMs; B3: past the pairs
    monkeypatch.setattr(attention, "MATMUL_MAX_SLOTS", 2 * 16)
    v = run_sweep([Variant("dense", tiny_model)], cfg, "cpu")["variants"]["dense"]
    assert [(r["batch"], r["decode_attention"]) for r in v["decode"]] == [(1, "matmul"), (3, "sdpa")]


def test_weight_bytes_skip_untied_embedding_only():
    m = tiny_model("llama")
    total = sum(p.numel() * 4 for p in m.parameters())
    assert weight_bytes_per_step(m) == total - m.get_input_embeddings().weight.numel() * 4
    m.lm_head.weight = m.get_input_embeddings().weight  # tied: the table is read by the head
    assert weight_bytes_per_step(m) == sum(p.numel() * 4 for p in m.parameters())


def test_oom_point_is_recorded_and_the_sweep_goes_on(monkeypatch):
    real = infer.prefill_point

    def fake(model, batch, seq, cfg, *args):
        if batch == 2 and seq == 16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        return real(model, batch, seq, cfg, *args)

    monkeypatch.setattr(infer, "prefill_point", fake)
    cfg = SweepConfig(**{**TINY.to_dict(), "profile_kernels": False, "decode_batches": (1,)})
    res = run_sweep([Variant("dense", tiny_model)], cfg, "cpu")
    pts = res["variants"]["dense"]["prefill"]
    assert [r["status"] for r in pts] == ["ok", "ok", "ok", "oom"]
    assert "out of memory" in pts[3]["error"]
    assert all(r["status"] == "ok" for r in res["variants"]["dense"]["decode"])


def test_a_dynamo_guard_bug_is_retried_once_after_a_reset(monkeypatch, capsys):
    """PyTorch's "Guard failed on the same frame it was created" (seen once on an H100): the point is
    compiled again after torch._dynamo.reset() and recorded as retried, not timed eager; a second
    failure falls back eager as any other, saying it was retried."""
    from gac.eval.infer import DYNAMO_GUARD_BUG, _fast_or_eager

    resets = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    calls = []

    def point(forward, graphs, fail=1):
        calls.append(forward is not None)
        if forward is not None and sum(calls) <= fail:
            raise AssertionError(f"{DYNAMO_GUARD_BUG}. This is a bug - please create an issue.")
        return {"status": "ok", "compiled": forward is not None}

    dev = torch.device("cpu")
    rec = _fast_or_eager(point, forward=object(), graphs=False, what="decode B=64", dev=dev)
    assert (
        rec["compiled"]
        and rec["retried"].startswith("AssertionError: Guard failed")
        and "fallback" not in rec
    )
    assert resets == [1] and calls == [True, True]
    calls.clear()
    rec = _fast_or_eager(lambda f, g: point(f, g, fail=2), forward=object(), graphs=False, what="x", dev=dev)
    assert (
        not rec["compiled"] and rec["fallback"].endswith("(after a retry)") and calls == [True, True, False]
    )
    # any other compile failure is not retried
    calls.clear()
    rec = _fast_or_eager(
        lambda f, g: (calls.append(f is not None), {"status": "ok"})[1] if f is None else 1 / 0,
        forward=object(), graphs=False, what="y", dev=dev,
    )  # fmt: skip
    assert rec["fallback"].startswith("eager: ZeroDivisionError") and calls == [False] and resets == [1, 1]


def test_a_step_that_cannot_be_compiled_is_timed_eager_with_a_notice(monkeypatch, capsys):
    # the fast path asked for (compile), and a forward whose compiled form fails: every point says why,
    # is timed eager and labelled; a failure of the eager model itself stays an error
    def broken_compile(fn, **kw):
        def compiled(*a, **k):
            raise RuntimeError("cannot trace: data-dependent control flow in forward")

        return compiled

    # sweep_model looks resolve_fast_path up in gac.eval.infer (imported from gac.runtime.step)
    monkeypatch.setattr(infer, "resolve_fast_path", lambda cfg, dev: (False, True))
    monkeypatch.setattr(torch, "compile", broken_compile)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: None)
    cfg = SweepConfig(**{**TINY.to_dict(), "profile_kernels": False, "decode_batches": (1,)})
    res = run_sweep([Variant("dense", tiny_model)], cfg, "cpu")
    v = res["variants"]["dense"]
    pts = v["prefill"] + v["decode"]
    assert pts and all(r["status"] == "ok" for r in pts)
    assert all(r["fallback"].startswith("eager: RuntimeError: cannot trace") for r in pts)
    assert all(not r["compiled"] and not r["graphs"] for r in pts)
    assert len(v["fallbacks"]) == len(pts)
    err = capsys.readouterr()
    assert "could not be compiled/captured (RuntimeError: cannot trace" in err.out + err.err


def test_cuda_graphs_on_cpu_fall_back_with_a_notice(capsys):
    cfg = SweepConfig(**{**TINY.to_dict(), "profile_kernels": False, "decode_batches": (1,), "graphs": True})
    v = run_sweep([Variant("dense", tiny_model)], cfg, "cpu")["variants"]["dense"]
    assert v["graphs"] is False and all(not r["graphs"] for r in v["prefill"] + v["decode"])
    err = capsys.readouterr()
    assert "notice: --graphs needs CUDA" in err.out + err.err
    with pytest.raises(GacError, match="CUDA graphs"):  # the low-level step itself still refuses
        DecodeStep(tiny_model(), 1, 16, graphs=True)


def test_decode_steps_advance_the_static_cache_like_generate():
    """Successive eager steps from a filled prefix give the logits of one long forward pass."""
    m = tiny_model("llama")
    ids = torch.randint(0, 250, (1, 12))
    with torch.no_grad():
        ref = m(ids).logits[0, -4:]
        step = DecodeStep(m, 1, 32, graphs=False)
        step.set_position(0)
        for layer in step.cache.layers:
            layer.keys.zero_()
            layer.values.zero_()
        m(input_ids=ids[:, :8], **cache_arg(m, step.cache), use_cache=True)  # prefill 8 into the cache
        got = []
        for t in range(8, 12):
            step.ids.copy_(ids[:, t : t + 1])
            got.append(step()[0, -1])
    torch.testing.assert_close(torch.stack(got), ref, rtol=1e-4, atol=1e-4)


def test_fast_path_resolution_on_cpu(capsys):
    """Compile defaults on only where CUDA is; an explicit request on CPU falls back with one notice line."""
    cpu = torch.device("cpu")
    assert resolve_fast_path(SweepConfig(), cpu) == (False, False)
    assert resolve_fast_path(SweepConfig(compile=True), cpu) == (False, False)
    cap = capsys.readouterr()
    lines = [ln for ln in (cap.out + cap.err).splitlines() if "compile" in ln]
    assert len(lines) == 1 and lines[0].startswith("notice:")
    assert resolve_fast_path(SweepConfig(graphs=True), cpu) == (False, False)
    cap = capsys.readouterr()
    lines = [ln for ln in (cap.out + cap.err).splitlines() if "graphs" in ln]
    assert len(lines) == 1 and lines[0].startswith("notice: --graphs needs CUDA")


def test_prefill_flops_counts_linears_attention_and_last_token_head():
    import torch
    from transformers import AutoModelForCausalLM

    from gac.eval.infer import prefill_flops
    from gac.models.shapes import shape_config
    from gac.nn import FactorizedLinear, replace_module

    cfg = shape_config("shape:llama3-8b:2:8")
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    h, i, v, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    per_token = 2 * L * (h * h + 2 * h * kv + h * h + 3 * h * i)
    b, s = 2, 64
    want = b * s * per_token + 2 * b * s * s * h * L + b * 2 * h * v
    assert prefill_flops(m, b, s) == want
    # a factorized layer counts its two factors
    fqn = "model.layers.0.mlp.down_proj"
    with torch.device("meta"):
        replace_module(m, fqn, FactorizedLinear(i, 100, h, bias=False))
    assert prefill_flops(m, b, s) == want - b * s * 2 * (i * h - 100 * (i + h))
    # fusing q/k/v and gate/up (dense and factorized members) leaves the count unchanged
    from gac.nn.fused import fuse_projections_

    before = prefill_flops(m, b, s)
    assert len(fuse_projections_(m)) == 2 * L
    assert prefill_flops(m, b, s) == before


def test_flop_ideal_ignores_version_1_counts_of_fused_models():
    from gac.eval.infer import add_speedups

    def variant(ms, flops, fused, counter=None):
        r = {"phase": "prefill", "batch": 1, "seq": 8, "status": "ok", "median_ms": ms, "flops": flops}
        if counter:
            r["flops_counter"] = counter
        return {"fused": fused, "prefill": [r], "decode": []}

    res = {"variants": {"base": variant(2.0, 100.0, 0), "c": variant(1.0, 80.0, 0)}}
    add_speedups(res)
    assert res["variants"]["c"]["prefill"][0]["flop_ideal_speedup"] == 1.25
    res = {"variants": {"base": variant(2.0, 60.0, 4), "c": variant(1.0, 80.0, 4)}}  # counter 1, fused
    add_speedups(res)
    assert "flop_ideal_speedup" not in res["variants"]["c"]["prefill"][0]
    res = {"variants": {"base": variant(2.0, 100.0, 4, 2), "c": variant(1.0, 80.0, 4, 2)}}
    add_speedups(res)
    assert res["variants"]["c"]["prefill"][0]["flop_ideal_speedup"] == 1.25


def test_decode_kernel_options_are_plumbed_and_recorded_on_cpu():
    from gac.llm_run import build_parser
    from gac.plans.schema import parse_plan

    a = build_parser().parse_args(
        ["--variant", "baseline", "--out", "x", "--no-fused-lowrank", "--no-gemv", "--no-branches"]
    )
    assert not a.fused_lowrank and not a.gemv and not a.branches and a.gqa_decode
    d = build_parser().parse_args(["--variant", "baseline", "--out", "x"])
    assert d.fused_lowrank and d.gemv and d.branches  # defaults: every measured decode kernel on
    assert (
        SweepConfig().fused_lowrank is True and SweepConfig().gemv is True and SweepConfig().branches is True
    )
    cfg = SweepConfig(
        **{**TINY.to_dict(), "profile_kernels": False, "decode_batches": (1,), "fused_lowrank": True}
    )
    v = run_sweep([Variant("dense", tiny_model)], cfg, "cpu")["variants"]["dense"]
    assert v["fused_lowrank"] == {"modules": 0, "reason": "not on CUDA"}
    assert v["gemv"] == {"modules": 0, "reason": "not on CUDA"}
    assert v["branches"] == {"modules": 0, "reason": "not on CUDA"}
    plan = {"axes": {"models": ["tiny:llama"], "compressors": ["svd"], "ratios": [0.5]}}
    ok = parse_plan({**plan, "evals": [{"kind": "infer", "fused_lowrank": True, "gemv": False}]})
    assert ok.evals[0]["fused_lowrank"] is True
    with pytest.raises(GacError, match="fused_lowrank must be true or false"):
        parse_plan({**plan, "evals": [{"kind": "infer", "fused_lowrank": "yes"}]})
    assert parse_plan({**plan, "evals": [{"kind": "infer", "branches": False}]}).evals[0]["branches"] is False
    with pytest.raises(GacError, match="branches must be true or false"):
        parse_plan({**plan, "evals": [{"kind": "infer", "branches": 1}]})
    assert (
        not build_parser()
        .parse_args(["--variant", "baseline", "--out", "x", "--no-combo-kernels"])
        .combo_kernels
    )
    assert d.combo_kernels and SweepConfig().combo_kernels is True
    assert v["combo_kernels"] is False  # recorded: nothing compiled on CPU
    off = parse_plan({**plan, "evals": [{"kind": "infer", "combo_kernels": False}]})
    assert off.evals[0]["combo_kernels"] is False
    with pytest.raises(GacError, match="combo_kernels must be true or false"):
        parse_plan({**plan, "evals": [{"kind": "infer", "combo_kernels": "no"}]})


def test_compile_step_passes_the_inductor_options(monkeypatch):
    """Combo kernels by default; a mode's own options merged in (torch.compile takes mode or options)."""
    import torch._inductor

    seen = []
    monkeypatch.setattr(torch, "compile", lambda f, **kw: seen.append(kw) or f)
    f = lambda x: x  # noqa: E731
    assert compile_step(f) is f
    assert compile_step(f, combo_kernels=False, dynamic=False) is f
    compile_step(f, "max-autotune-no-cudagraphs", dynamic=False)
    assert seen[0] == {"dynamic": None, "options": {"combo_kernels": True}}
    assert seen[1] == {"dynamic": False, "options": None}
    want = {**torch._inductor.list_mode_options("max-autotune-no-cudagraphs", False), "combo_kernels": True}
    assert seen[2] == {"dynamic": False, "options": want} and want["max_autotune"] is True


def test_compile_step_compiles_a_tiny_model_on_cpu_like_eager():
    """The options are ones this torch's Inductor accepts (an unknown one raises) and change no result."""
    torch.manual_seed(0)
    m = tiny_model().eval()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        want = m(ids).logits
        got = compile_step(m.forward, dynamic=False)(ids).logits
    torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_compile_step_with_combo_kernels_matches_without_on_gpu():
    """On CUDA the combo kernels change launches, not results: compiled logits with and without them agree."""
    torch.manual_seed(0)
    m = tiny_model().to("cuda", torch.bfloat16).eval()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]], device="cuda")
    out = {}
    with torch.no_grad():
        for combo in (True, False):
            torch._dynamo.reset()
            out[combo] = compile_step(m.forward, combo_kernels=combo, dynamic=False)(ids).logits.float()
        want = m(ids).logits.float()
    torch._dynamo.reset()
    torch.testing.assert_close(out[True], out[False], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out[True], want, rtol=5e-2, atol=5e-2)


def test_capacity_budget_below_one_sequence_is_one_line_error_before_any_timing(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("timed before the budget was checked")

    monkeypatch.setattr(infer, "prefill_point", boom)
    monkeypatch.setattr(infer, "decode_point", boom)
    m = tiny_model("llama")
    cfg = SweepConfig(**{**TINY.to_dict(), "capacity_context": 4096, "capacity_budget_gib": 1e-4})
    with pytest.raises(
        GacError, match=r"memory budget 0\.00 GiB is smaller than .* one sequence at context 4096"
    ):
        infer.sweep_model(m, cfg)


def test_capacity_plan_counts_weights_and_kv_bytes_per_token():
    m = tiny_model("llama")
    c = m.config
    el = next(m.parameters()).element_size()
    cfg = SweepConfig(**{**TINY.to_dict(), "capacity_context": 100, "capacity_budget_gib": 1.0})
    p = infer._capacity_budget(m, cfg)
    hd = c.head_dim if getattr(c, "head_dim", None) else c.hidden_size // c.num_attention_heads
    assert p["kv_per_token"] == c.num_hidden_layers * 2 * c.num_key_value_heads * hd * el
    assert p["weights"] == sum(t.numel() * t.element_size() for t in [*m.parameters(), *m.buffers()])
    assert p["budget"] == 2**30 and p["context"] == 100
    with pytest.raises(GacError, match="needs a GPU"):  # the workspace is measured: CUDA only
        infer.capacity_point(m, cfg, False, 0, None, None, p)


class _Memory:
    """A device whose decode step at batch ``b`` peaks at ``held + b·seq + workspace(b)``, and which runs out of
    memory past ``capacity`` bytes: what the capacity search sees of a GPU, without one."""

    def __init__(self, held, seq, workspace, capacity):
        self.held, self.seq, self.workspace, self.capacity = held, seq, workspace, capacity
        self.tried: list[int] = []

    def peak(self, b):
        return self.held + b * self.seq + self.workspace(b)

    def __call__(self, b, budget):
        self.tried.append(b)
        p = self.peak(b)
        return None if p > self.capacity or p > budget else p


def test_capacity_search_climbs_past_a_pessimistic_prediction_and_keeps_the_last_fit():
    gib = 2**30
    # the workspace grows by 300 MB from batch 1 to 2 (what the prediction extrapolates), then stays flat: the
    # shape the H100 showed (palu-default run 8: 310 MB a sequence predicted, 70 MB in all at batch 56)
    dev = _Memory(held=5 * gib, seq=gib, workspace=lambda b: 300 * 2**20 * min(b, 2), capacity=80 * gib)
    budget = int(78.5 * gib)
    predicted = int((budget - dev.held) // (dev.seq + 300 * 2**20))
    b = infer.largest_fitting_batch(lambda n: dev(n, budget), predicted, budget, dev.held)
    assert dev.tried[0] == predicted and b > predicted, (dev.tried, b)
    assert dev.peak(b) <= budget < dev.peak(b + 1), (dev.tried, b)  # the largest that fits: 72 of 73.5
    assert len(dev.tried) <= 1 + infer.CAPACITY_MAX_PROBES
    # a prediction past what fits walks down first, then climbs again only where the fit leaves room
    dev.tried.clear()
    b = infer.largest_fitting_batch(lambda n: dev(n, budget), 90, budget, dev.held)
    assert dev.tried[0] == 90 and dev.tried[1] == 85 and b == 72, (dev.tried, b)
    # a device that runs out of memory before the budget: after a miss the climb halves the gap until it closes
    # (three tries, as before, stopped at 48 of 55)
    dev = _Memory(held=5 * gib, seq=gib, workspace=lambda b: 0, capacity=60 * gib)
    b = infer.largest_fitting_batch(lambda n: dev(n, budget), 40, budget, dev.held)
    assert dev.tried == [40, 73, 56, 48, 52, 54, 55] and b == 55, (dev.tried, b)
    # a coarser resolution stops within it: 2 sequences of 100 at 2%
    dev = _Memory(held=5 * gib, seq=gib / 2, workspace=lambda b: 0, capacity=56 * gib)  # 102 fit
    b = infer.largest_fitting_batch(lambda n: dev(n, budget), 60, budget, dev.held)
    assert dev.peak(b) <= 56 * gib and 102 - b <= max(1, int(0.02 * b)), (dev.tried, b)
    assert len(dev.tried) <= 1 + infer.CAPACITY_MAX_PROBES
    # nothing fits: 0, after trying down to 1
    dev = _Memory(held=5 * gib, seq=100 * gib, workspace=lambda b: 0, capacity=80 * gib)
    assert infer.largest_fitting_batch(lambda n: dev(n, budget), 3, budget, dev.held) == 0
    assert dev.tried == [3, 2, 1]


def test_capacity_workspace_grows_by_the_timed_steps_peaks_not_the_compiles():
    """What a sequence adds comes from the timed steps' peaks at batch 1 and 2: a compile transient at batch 2 (1 GiB
    here, as dense Llama-3-8B at 32k showed on an H200) no longer reads as a gigabyte a sequence; the fixed part keeps
    batch 1's whole peak; points without the timed peak fall back to the whole ones."""
    gib = 2**30

    def pt(b, whole, steady):
        return {"batch": b, "peak_mem_gib": 5 + b + whole, "steady_peak_mem_gib": steady and 5 + b + steady,
                "held_before_gib": 5.0, "kv_bytes": b * gib}  # fmt: skip

    fixed, per = infer.workspace([pt(1, 0.2, 0.06), pt(2, 1.25, 0.07)])
    assert per == pytest.approx(0.01 * gib) and fixed == pytest.approx(0.19 * gib)
    budget, held = 139 * gib, 5.3 * gib
    assert (budget - held - fixed) // (
        gib + per
    ) == 132  # the old reading, 1.05 GiB a sequence, started at 65
    fixed, per = infer.workspace([pt(1, 0.2, None), pt(2, 1.25, None)])
    assert per == pytest.approx(1.05 * gib) and fixed == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_capacity_on_gpu_runs_the_largest_batch_that_fits_the_budget():
    m = tiny_model("llama").cuda()
    cfg = SweepConfig(
        **{**TINY.to_dict(), "profile_kernels": False, "decode_batches": (1,), "compile": False}
    )
    ctx = 512  # the tiny model's max_position_embeddings
    plan = infer._capacity_budget(m, SweepConfig(**{**cfg.to_dict(), "capacity_context": ctx}))
    seq = plan["kv_per_token"] * ctx
    # a first search under a loose budget measures what the sweep holds when the search begins (its earlier
    # points' graph pools and workspaces: 236 MB beyond the 1 MB of weights on an H100) and the workspace
    before = torch.cuda.memory_allocated()
    loose = before + 200 * seq + 2**30
    cfg = SweepConfig(**{**cfg.to_dict(), "capacity_context": ctx, "capacity_budget_gib": loose / 2**30})
    first = infer.sweep_model(m, cfg)["capacity"]
    assert first["max_batch"] >= 1 and first["peak_mem_gib"] * 2**30 <= loose * 1.02, first
    # then a budget of about 50 sequences beyond what the first sweep held. What a second sweep holds when
    # its search begins is not the first's (on an H100: 236 MB, then 1.03 GiB with a graph-capture stream per
    # call; 101 MB with one warm-up stream per device), so the search is checked against its own record:
    # the batch it ran is the largest whose sequences and measured workspace fit beside what it held, and
    # that batch's peak stayed within the budget (the workspace model did not under-count).
    per = seq + first["workspace_per_seq_bytes"]
    budget = int(first["held_bytes"] + first["workspace_fixed_bytes"] + 50.5 * per)
    cfg = SweepConfig(**{**cfg.to_dict(), "capacity_budget_gib": budget / 2**30})
    out = infer.sweep_model(m, cfg)["capacity"]
    ok = [t["batch"] for t in out["tries"] if t["status"] == "ok"]
    assert out["max_batch"] >= 1 and out["max_batch"] == max(ok), (budget, out)
    assert all(t["peak_gib"] * 2**30 > budget for t in out["tries"] if t["status"] == "over_budget"), out
    per2 = seq + out["workspace_per_seq_bytes"]
    room = budget - out["held_bytes"] - out["workspace_fixed_bytes"]
    assert out["predicted_max_batch"] * per2 <= room < (out["predicted_max_batch"] + 1) * per2, out
    assert out["peak_mem_gib"] * 2**30 <= budget * 1.02, (budget, out)
    assert out["tokens_per_s"] > 0
    # a budget that holds the weights and one sequence but not the measured workspace: one line, no record
    tight = (plan["weights"] + seq + 2**20) / 2**30
    with pytest.raises(GacError, match="holds no sequence at context 512"):
        infer.sweep_model(m, SweepConfig(**{**cfg.to_dict(), "capacity_budget_gib": tight}))
