"""Fault injection over every command: bad input gets one line, nothing is lost or half-written.

One table of cases (:data:`CASES`), each a command line with placeholders, the exit status it must
end with and a fragment of its one-line message. For every case the test asserts: the exit status;
no traceback; for exit status 2 from gac itself, exactly one ``error: ...`` line and it is the last
one; nothing at ``{out}``; no temporary directory left anywhere under the scratch directory; and
that the protected files of the case are intact. Signals (SIGINT, SIGKILL) need a real process and
run in subprocesses at the end of the file.

New commands join the table: add rows, not tests.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gac.cli import main
from gac.testing import char_tokenizer, tiny_model

SRC = Path(__file__).resolve().parents[1] / "src"
ENGLISH = (
    "The Encyclopaedia Britannica, eleventh edition, was published in twenty-nine volumes. "
    "It is a dictionary of arts, sciences, literature and general information. "
) * 40


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Path]:
    """Shared read-only inputs: a tiny HF dir with a tokenizer, a gac-compressed dir, texts."""
    root = tmp_path_factory.mktemp("faults_base")
    tiny = root / "tiny"
    tiny_model("llama").save_pretrained(tiny)
    char_tokenizer().save_pretrained(tiny)
    gacdir = root / "gacdir"
    assert (
        main(["compress", str(tiny), "-c", "svd", "-r", "0.9", "--profile", "default", "--out", str(gacdir)])
        == 0
    )
    rep = root / "rep"
    assert main(["repair", str(tiny), "-s", "optimal", "--profile", "default", "--out", str(rep)]) == 0
    (root / "english.txt").write_text(ENGLISH)
    calib = root / "calib"  # calibrated on the calibration part of english.txt
    args = ["compress", str(tiny), "-c", "svd-llm", "-r", "0.9", "--profile", "default", "--out", str(calib)]
    assert (
        main([*args, "--calib", f"text:{root / 'english.txt'}", "--n-samples", "4", "--seq-len", "64"]) == 0
    )
    (root / "short.txt").write_text("Too short.")
    (root / "random.txt").write_bytes(os.urandom(20000))
    (root / "file.txt").write_text("a plain file\n")
    demo = {"schema": "gac.demo/1", "rows": [], "env": {}}
    (root / "demo.json").write_text(json.dumps(demo))
    return {"tiny": tiny, "gacdir": gacdir, "rep": rep, "calib": calib, "root": root}


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _truncate(d: Path, name: str = "model.safetensors", keep: int = 1000) -> Path:
    f = d / name
    f.write_bytes(f.read_bytes()[:keep])
    return d


def _json_edit(d: Path, name: str, **changes) -> Path:
    f = d / name
    doc = json.loads(f.read_text())
    doc.update(changes)
    f.write_text(json.dumps(doc))
    return d


# Setups: build a (corrupt) input under the case's scratch dir; return extra placeholders.
def s_trunc_hf(t, b):
    return {"m": _truncate(_copy(b["tiny"], t / "m"))}


def s_garbage_hf(t, b):
    d = _copy(b["tiny"], t / "m")
    (d / "model.safetensors").write_bytes(os.urandom(5000))
    return {"m": d}


def s_empty_weights(t, b):
    d = _copy(b["tiny"], t / "m")
    (d / "model.safetensors").write_bytes(b"")
    return {"m": d}


def s_bad_json(t, b):
    d = _copy(b["tiny"], t / "m")
    (d / "config.json").write_text("{not json")
    return {"m": d}


def s_cfg(**changes):
    def setup(t, b):
        return {"m": _json_edit(_copy(b["tiny"], t / "m"), "config.json", **changes)}

    return setup


def s_gac(name: str, **changes):
    def setup(t, b):
        return {"m": _json_edit(_copy(b["gacdir"], t / "m"), name, **changes)}

    return setup


def s_gac_badjson(t, b):
    d = _copy(b["gacdir"], t / "m")
    (d / "gac_config.json").write_text("[1, 2")
    return {"m": d}


def s_trunc_gac(t, b):
    return {"m": _truncate(_copy(b["gacdir"], t / "m"))}


def s_trunc_rep(t, b):
    d = _copy(b["rep"], t / "m")
    return {"m": _truncate(d, sorted(p.name for p in d.glob("*.safetensors"))[0])}


def s_rep_json(**changes):
    def setup(t, b):
        return {"m": _json_edit(_copy(b["rep"], t / "m"), "gac_repair.json", **changes)}

    return setup


def s_nonempty_out(t, b):
    d = t / "busy"
    d.mkdir()
    (d / "keep.txt").write_text("keep me")
    return {"busy": d, "protect": d / "keep.txt"}


def s_file_out(t, b):
    f = t / "afile"
    f.write_text("keep me")
    return {"afile": f, "protect": f}


def s_textdir(t, b):
    (t / "adir").mkdir()
    return {"adir": t / "adir"}


def s_bad_report(t, b):
    d = t / "res"
    d.mkdir()
    (d / "x.json").write_text("{broken")
    return {"res": d}


def s_lm_variant(t, b):
    return {}


C = "compress"
TINY = "{tiny}"
SVD = ["-c", "svd", "-r", "0.9", "--profile", "default"]

# (id, argv, exit status, message fragment, setup)
CASES: list[tuple[str, list[str], int, str, object]] = [
    # --- usage errors: typer's usage message, status 2
    ("usage-no-command-args", [C], 2, "Missing argument", None),
    ("usage-missing-out", [C, TINY], 2, "Missing option", None),
    ("usage-ratio-not-number", [C, TINY, "-r", "abc", "--out", "{out}"], 2, "Invalid value", None),
    ("usage-int-not-int", [C, TINY, "--batch-size", "x", "--out", "{out}"], 2, "Invalid value", None),
    ("usage-unknown-option", [C, TINY, "--bogus", "--out", "{out}"], 2, "No such option", None),
    ("usage-unknown-command", ["frobnicate"], 2, "No such command", None),
    ("usage-repair-no-args", ["repair"], 2, "Missing argument", None),
    ("usage-analyze-no-args", ["analyze"], 2, "Missing argument", None),
    ("usage-eval-unknown", ["eval", "speed"], 2, "No such command", None),
    ("usage-eval-ppl-no-model", ["eval", "ppl"], 2, "Missing argument", None),
    ("usage-bench-no-experiment", ["bench"], 2, "Missing option", None),
    ("usage-profile-no-out", ["profile"], 2, "Missing option", None),
    ("usage-demo-bad-number", ["demo", "--param-ratio", "x", "--out", "{out}"], 2, "Invalid value", None),
    ("usage-report-no-args", ["report"], 2, "Missing argument", None),
    # --- compress: numbers, options, devices, dtypes, datasets
    ("compress-ratio-high", [C, TINY, *SVD, "-r", "1.2", "--out", "{out}"], 2, "between 0 and 1", None),
    ("compress-ratio-zero", [C, TINY, *SVD, "-r", "0", "--out", "{out}"], 2, "between 0 and 1", None),
    (
        "compress-ratio-unmeetable",
        [C, TINY, *SVD, "-r", "0.0005", "--out", "{out}"],
        2,
        "cannot be met",
        None,
    ),
    ("compress-unknown-compressor", [C, TINY, "-c", "nope", "--out", "{out}"], 2, "unknown compressor", None),
    ("compress-option-not-kv", [C, TINY, *SVD, "-O", "alpha", "--out", "{out}"], 2, "KEY=VALUE", None),
    (
        "compress-option-unknown",
        [C, TINY, *SVD, "-O", "bogus=1", "--out", "{out}"],
        2,
        "no option 'bogus'",
        None,
    ),
    (
        "compress-option-type",
        [C, TINY, "-c", "asvd", "-O", "alpha=x", "--out", "{out}"],
        2,
        "must be a number",
        None,
    ),
    (
        "compress-option-list",
        [C, TINY, "-c", "asvd", "-O", "probe_ratios=a,b", "--out", "{out}"],
        2,
        "must be a number",
        None,
    ),
    (
        "compress-option-range",
        [C, TINY, "-c", "asvd", "-O", "probe_ratios=0.6,1.5", "--out", "{out}"],
        2,
        "(0, 1)",
        None,
    ),
    (
        "compress-option-int",
        [C, TINY, "-c", "asvd", "-O", "sensitivity_samples=2.5", "--out", "{out}"],
        2,
        "integer",
        None,
    ),
    (
        "compress-palu-key-group",
        [C, TINY, "-c", "palu", "-O", "k_group_size=2", "--out", "{out}"],
        2,
        "key group size 2 does not divide the model's 1 KV heads",
        None,
    ),
    (
        "compress-palu-value-group",
        [C, TINY, "-c", "palu", "-O", "v_group_size=3", "--out", "{out}"],
        2,
        "value group size 3 does not divide",
        None,
    ),
    (
        "compress-palu-below-modulus",
        [C, TINY, "-c", "palu", "-r", "0.05", "--profile", "default", "--out", "{out}"],
        2,
        "below one rank modulus",
        None,
    ),
    ("compress-device-tpu", [C, TINY, *SVD, "--device", "tpu", "--out", "{out}"], 2, "unknown device", None),
    (
        "compress-device-cuda-index",
        [C, TINY, *SVD, "--device", "cuda:x", "--out", "{out}"],
        2,
        "device",
        None,
    ),
    ("compress-device-cpu-index", [C, TINY, *SVD, "--device", "cpu:3", "--out", "{out}"], 2, "device", None),
    ("compress-dtype", [C, TINY, *SVD, "--dtype", "float8", "--out", "{out}"], 2, "unknown dtype", None),
    ("compress-align", [C, TINY, *SVD, "--align", "best", "--out", "{out}"], 2, "align", None),
    # --- compress: serving shapes and the latency guard
    (
        "compress-serve-malformed",
        [C, TINY, *SVD, "--serve", "prefill:8", "--out", "{out}"],
        2,
        "prefill:BxS",
        None,
    ),
    ("compress-serve-empty", [C, TINY, *SVD, "--serve", "", "--out", "{out}"], 2, "no serving shape", None),
    (
        "compress-serve-comma",
        [C, TINY, *SVD, "--serve", "decode:1,", "--out", "{out}"],
        2,
        "no serving shape",
        None,
    ),
    (
        "compress-serve-phase",
        [C, TINY, *SVD, "--serve", "train:1x8", "--out", "{out}"],
        2,
        "decode:B[xKV]",
        None,
    ),
    (
        "compress-serve-beyond-context",
        [C, TINY, *SVD, "--serve", "prefill:1x100000", "--out", "{out}"],
        2,
        "beyond the model's maximum context",
        None,
    ),
    (
        "compress-verify-no-gpu",
        [C, TINY, *SVD, "--verify", "--device", "cpu", "--out", "{out}"],
        2,
        "--verify times the model",
        None,
    ),
    (
        "compress-allow-slower-align-none",
        [C, TINY, *SVD, "--allow-slower", "--align", "none", "--out", "{out}"],
        2,
        "no guard to lift",
        None,
    ),
    (
        "compress-guard-infeasible",
        [C, TINY, "-c", "svd", "-r", "0.9", "--profile", "h200-bfloat16", "--out", "{out}"],
        2,
        "cannot be met without a slowdown",
        None,
    ),
    (
        "compress-profile",
        [C, TINY, *SVD[:4], "--profile", "nosuch-gpu", "--out", "{out}"],
        2,
        "profile",
        None,
    ),
    (
        "compress-calib-unknown",
        [C, TINY, "-c", "asvd", "--calib", "nosuch", "--out", "{out}"],
        2,
        "unknown text source",
        None,
    ),
    (
        "compress-calib-missing",
        [C, TINY, "-c", "asvd", "--calib", "text:/nonexistent.txt", "--out", "{out}"],
        2,
        "does not exist",
        None,
    ),
    (
        "compress-calib-dir",
        [C, TINY, "-c", "asvd", "--calib", "text:{adir}", "--out", "{out}"],
        2,
        "is a directory",
        s_textdir,
    ),
    (
        "compress-calib-random-bytes",
        [
            C,
            TINY,
            "-c",
            "asvd",
            "-r",
            "0.9",
            "-O",
            "probe_ratios=0.6,0.8,0.9",
            "--calib",
            "text:{root}/random.txt",
            "--profile",
            "default",
            "--out",
            "{out}",
        ],
        2,
        "not text",
        None,
    ),
    (
        "compress-calib-too-short",
        [
            C,
            TINY,
            "-c",
            "svd-llm",
            "-r",
            "0.9",
            "--calib",
            "text:{root}/short.txt",
            "--n-samples",
            "4",
            "--seq-len",
            "64",
            "--profile",
            "default",
            "--out",
            "{out}",
        ],
        2,
        "",
        None,
    ),
    # --- output paths
    ("out-nonempty", [C, TINY, *SVD, "--out", "{busy}"], 2, "not empty", s_nonempty_out),
    ("out-file-no-overwrite", [C, TINY, *SVD, "--out", "{afile}"], 2, "is a file", s_file_out),
    ("out-proc", [C, TINY, *SVD, "--out", "/proc/gac-out"], 2, "/proc", None),
    ("out-sys", [C, TINY, *SVD, "--out", "/sys/kernel/gac-out"], 2, "/sys", None),
    ("out-cwd", [C, TINY, *SVD, "--overwrite", "--out", "."], 2, "current directory", None),
    ("out-root", [C, TINY, *SVD, "--overwrite", "--out", "/"], 2, "root", None),
    (
        "out-parent-of-cwd",
        [C, TINY, *SVD, "--overwrite", "--out", ".."],
        2,
        "contains the current directory",
        None,
    ),
    ("out-under-file", [C, TINY, *SVD, "--out", "{root}/file.txt/sub"], 2, "not a directory", None),
    ("repair-out-nonempty", ["repair", TINY, "--out", "{busy}"], 2, "not empty", s_nonempty_out),
    ("demo-out-cwd", ["demo", "--out", "."], 2, "current directory", None),
    ("demo-out-cwd-overwrite", ["demo", "--overwrite", "--out", "."], 2, "current directory", None),
    ("demo-out-nonempty", ["demo", "--out", "{busy}"], 2, "not empty", s_nonempty_out),
    ("generate-empty-prompt", ["generate", TINY, "--prompt", ""], 2, "the prompt is empty", None),
    (
        "generate-zero-tokens",
        ["generate", TINY, "--prompt", "Hi", "-n", "0"],
        2,
        "--max-new-tokens must be",
        None,
    ),
    ("profile-out-dir", ["profile", "--out", "{busy}"], 2, "directory", s_nonempty_out),
    ("profile-out-exists", ["profile", "--out", "{afile}"], 2, "already exists", s_file_out),
    ("ppl-out-proc", ["eval", "ppl", TINY, "--out", "/proc/x.json"], 2, "/proc", None),
    # --- models: missing, corrupt, truncated, absurd
    ("model-missing", [C, "/nonexistent/model", *SVD, "--out", "{out}"], 2, "no such file", None),
    ("model-is-text-file", [C, "{root}/file.txt", *SVD, "--out", "{out}"], 2, "not a model", None),
    ("model-empty-dir", [C, "{adir}", *SVD, "--out", "{out}"], 2, "not a model directory", s_textdir),
    ("hf-truncated-weights", [C, "{m}", *SVD, "--out", "{out}"], 2, "safetensors", s_trunc_hf),
    ("hf-garbage-weights", [C, "{m}", *SVD, "--out", "{out}"], 2, "", s_garbage_hf),
    ("hf-empty-weights", [C, "{m}", *SVD, "--out", "{out}"], 2, "", s_empty_weights),
    ("hf-config-not-json", [C, "{m}", *SVD, "--out", "{out}"], 2, "not valid JSON", s_bad_json),
    ("config-absurd-hidden", [C, "{m}", *SVD, "--out", "{out}"], 2, "hidden_size", s_cfg(hidden_size=10**9)),
    (
        "config-absurd-memory",
        [C, "{m}", *SVD, "--out", "{out}"],
        2,
        "GiB",
        s_cfg(
            hidden_size=100_000, intermediate_size=400_000, num_attention_heads=100, num_key_value_heads=100
        ),
    ),
    ("config-negative-size", [C, "{m}", *SVD, "--out", "{out}"], 2, "positive", s_cfg(intermediate_size=-5)),
    (
        "config-many-layers",
        [C, "{m}", *SVD, "--out", "{out}"],
        2,
        "num_hidden_layers",
        s_cfg(num_hidden_layers=100000),
    ),
    ("config-zero-vocab", [C, "{m}", *SVD, "--out", "{out}"], 2, "vocab_size", s_cfg(vocab_size=0)),
    ("config-string-size", [C, "{m}", *SVD, "--out", "{out}"], 2, "integer", s_cfg(hidden_size="120")),
    (
        "config-heads-mismatch",
        [C, "{m}", *SVD, "--out", "{out}"],
        2,
        "multiple",
        s_cfg(num_key_value_heads=2),
    ),
    (
        "gac-sites-wrong-type",
        ["analyze", "{m}", "--profile", "default"],
        2,
        "corrupt",
        s_gac("gac_config.json", factorized="oops"),
    ),
    ("gac-config-not-json", ["analyze", "{m}", "--profile", "default"], 2, "not valid JSON", s_gac_badjson),
    (
        "gac-truncated-weights",
        ["analyze", "{m}", "--profile", "default"],
        2,
        "model.safetensors",
        s_trunc_gac,
    ),
    (
        "gac-absurd-config",
        ["analyze", "{m}", "--profile", "default"],
        2,
        "num_hidden_layers",
        s_gac("config.json", num_hidden_layers=10**6),
    ),
    ("compress-already-compressed", [C, "{gacdir}", *SVD, "--out", "{out}"], 2, "already compressed", None),
    ("repaired-truncated-weights", ["analyze", "{m}", "--profile", "default"], 2, "", s_trunc_rep),
    (
        "repaired-json-wrong-type",
        ["analyze", "{m}", "--profile", "default"],
        2,
        "corrupt",
        s_rep_json(runtime="oops"),
    ),
    # --- repair
    ("repair-strategy", ["repair", TINY, "--strategy", "fastest", "--out", "{out}"], 2, "strategy", None),
    ("repair-dtype", ["repair", TINY, "--dtype", "int3", "--out", "{out}"], 2, "dtype", None),
    (
        "repair-profile",
        ["repair", TINY, "--profile", "/nonexistent.json", "--out", "{out}"],
        2,
        "profile",
        None,
    ),
    ("repair-truncated", ["repair", "{m}", "--out", "{out}"], 2, "safetensors", s_trunc_hf),
    # --- analyze
    ("analyze-missing", ["analyze", "/nonexistent/m"], 2, "no such file", None),
    (
        "analyze-out-proc",
        ["analyze", TINY, "--profile", "default", "--out", "/proc/a.json"],
        2,
        "/proc",
        None,
    ),
    # --- eval ppl
    ("ppl-dataset-unknown", ["eval", "ppl", TINY, "--dataset", "nosuch"], 2, "unknown text source", None),
    ("ppl-random-bytes", ["eval", "ppl", TINY, "--dataset", "text:{root}/random.txt"], 2, "not text", None),
    ("ppl-text-dir", ["eval", "ppl", TINY, "--dataset", "text:{adir}"], 2, "is a directory", s_textdir),
    (
        "ppl-too-short",
        ["eval", "ppl", TINY, "--dataset", "text:{root}/short.txt", "--seq-len", "64"],
        2,
        "",
        None,
    ),
    (
        "ppl-seq-len-zero",
        ["eval", "ppl", TINY, "--dataset", "text:{root}/english.txt", "--seq-len", "0"],
        2,
        "seq",
        None,
    ),
    (
        "ppl-windows-negative",
        [
            "eval",
            "ppl",
            TINY,
            "--dataset",
            "text:{root}/english.txt",
            "--seq-len",
            "64",
            "--max-windows",
            "-1",
        ],
        2,
        "windows",
        None,
    ),
    (
        "ppl-calibration-overlap",
        [
            "eval",
            "ppl",
            "{calib}",
            "--dataset",
            "text:{root}/english.txt@calib",
            "--seq-len",
            "64",
            "--out",
            "{out}.json",
        ],
        2,
        "overlap (characters 3200-6400 of the same text)",
        None,
    ),
    (
        "ppl-parts-too-short",
        ["eval", "ppl", TINY, "--dataset", "text:{root}/short.txt", "--seq-len", "8"],
        2,
        "too short to give both its parts a window of 8 tokens",
        None,
    ),
    (
        "ppl-seq-len-beyond-context",
        ["eval", "ppl", TINY, "--dataset", "text:{root}/english.txt@all", "--seq-len", "1024"],
        2,
        "--seq-len 1024 is beyond the model's context of 512 tokens",
        None,
    ),
    (
        "compress-seq-len-beyond-context",
        [
            C,
            TINY,
            "-c",
            "svd-llm",
            "-r",
            "0.9",
            "--calib",
            "text:{root}/english.txt",
            "--seq-len",
            "1024",
            "--out",
            "{out}",
        ],
        2,
        "beyond the model's context",
        None,
    ),
    ("ppl-device", ["eval", "ppl", TINY, "--device", "tpu"], 2, "unknown device", None),
    ("ppl-dtype", ["eval", "ppl", TINY, "--dtype", "fp4"], 2, "dtype", None),
    # --- eval lm_eval / infer
    (
        "lm-eval-task-unknown",
        [
            "eval",
            "lm_eval",
            "--variant",
            "baseline",
            "--baseline-model-id",
            TINY,
            "--tasks",
            "no_such_task_xyz",
            "--out",
            "{out}",
        ],
        2,
        "no_such_task_xyz",
        None,
    ),
    (
        "lm-eval-suite",
        ["eval", "lm_eval", "--variant", "baseline", "--suite", "bogus", "--out", "{out}"],
        2,
        "suite",
        None,
    ),
    ("lm-eval-variant", ["eval", "lm_eval", "--variant", "asvd:x:y:z", "--out", "{out}"], 2, "", None),
    (
        "infer-batches",
        ["eval", "infer", "--baseline-model-id", TINY, "--prefill-batches", "x", "--out", "{out}"],
        2,
        "",
        None,
    ),
    (
        "infer-device",
        ["eval", "infer", "--baseline-model-id", TINY, "--device", "tpu", "--out", "{out}"],
        2,
        "device",
        None,
    ),
    (
        "lm-eval-out-proc",
        [
            "eval",
            "lm_eval",
            "--variant",
            "baseline",
            "--suite",
            "ppl",
            "--baseline-model-id",
            TINY,
            "--out",
            "/proc/gac-r",
        ],
        2,
        "/proc",
        None,
    ),
    (
        "infer-out-proc",
        ["eval", "infer", "--baseline-model-id", TINY, "--out", "/proc/gac-r"],
        2,
        "/proc",
        None,
    ),
    (
        "infer-out-file",
        ["eval", "infer", "--baseline-model-id", TINY, "--out", "{afile}"],
        2,
        "is a file",
        s_file_out,
    ),
    # --- bench / profile
    ("bench-experiment", ["bench", "-e", "nosuch", "--out", "{out}"], 2, "unknown experiment", None),
    ("bench-dims", ["bench", "-e", "gemv", "--dims", "a:b", "--out", "{out}"], 2, "dims", None),
    (
        "bench-batch-zero",
        ["bench", "-e", "sdpa_sweep", "--batch", "0", "--out", "{out}"],
        2,
        "positive",
        None,
    ),
    ("bench-device", ["bench", "-e", "gemv", "--device", "tpu", "--out", "{out}"], 2, "unknown device", None),
    (
        "bench-dtype",
        ["bench", "-e", "gemv", "--dtype", "int8", "--device", "cpu", "--out", "{out}"],
        2,
        "dtype",
        None,
    ),
    ("profile-tolerance", ["profile", "--tolerance", "2", "--out", "{out}.json"], 2, "tolerance", None),
    ("profile-device", ["profile", "--device", "tpu", "--out", "{out}.json"], 2, "unknown device", None),
    # --- demo / report
    ("demo-ratio", ["demo", "--param-ratio", "2", "--out", "{out}"], 2, "param", None),
    ("demo-probe-ratios", ["demo", "--probe-ratios", "a", "--out", "{out}"], 2, "probe-ratios", None),
    ("demo-device", ["demo", "--device", "tpu", "--out", "{out}"], 2, "unknown device", None),
    (
        "demo-cpu-too-slow",
        ["demo", "-c", "asvd", "--device", "cpu", "--out", "{out}"],
        2,
        "over the CPU demo",
        None,
    ),
    ("report-missing", ["report", "/nonexistent/results"], 2, "", None),
    ("report-no-results", ["report", "{res}", "--out", "{out}"], 2, "", s_bad_report),
]


def _fill(args: list[str], ph: dict[str, Path]) -> list[str]:
    return [a.format(**{k: str(v) for k, v in ph.items()}) for a in args]


def _leaks(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".gac-" in p.name and p.name.endswith(".tmp")]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fault(case, base, tmp_path, monkeypatch, capsys):
    name, args, status, msg, setup = case
    work = tmp_path / "cwd"
    work.mkdir()
    (work / "precious.txt").write_text("keep me")  # the current directory's own data
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    ph: dict[str, Path] = {**base, "out": tmp_path / "out"}
    if setup is not None:
        ph.update(setup(tmp_path, base))
    protect = ph.pop("protect", None)
    before = protect.read_bytes() if protect else None
    rc = main(_fill(args, ph))
    err = capsys.readouterr().err
    assert rc == status, f"{name}: exit {rc}, stderr:\n{err}"
    assert "Traceback" not in err, err
    if name.startswith("usage-"):
        assert "Usage:" in err and msg in err, err
    else:
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("error: ")]
        assert len(errors) == 1 and lines[-1] == errors[0], err
        assert msg in errors[0], errors[0]
    assert not (tmp_path / "out").exists() and not Path(f"{tmp_path / 'out'}.json").exists()
    assert not _leaks(tmp_path) and not _leaks(base["root"])
    assert (work / "precious.txt").read_text() == "keep me" and sorted(os.listdir(work)) == ["precious.txt"]
    if protect:
        assert protect.read_bytes() == before


def test_overlap_is_allowed_explicitly_and_recorded(base, tmp_path, capsys):
    """--allow-overlap scores the calibration text and says so in the JSON; disjoint parts need no flag."""
    english = base["root"] / "english.txt"
    for dataset, flag, overlap in (
        (f"text:{english}@calib", ["--allow-overlap"], True),
        (f"text:{english}", [], False),
    ):
        out = tmp_path / f"{overlap}.json"
        args = ["eval", "ppl", str(base["calib"]), "--dataset", dataset, "--seq-len", "64", "--out", str(out)]
        assert main([*args, *flag]) == 0, capsys.readouterr().err
        split = json.loads(out.read_text())["split"]
        assert split["overlap"] is overlap and split["allow_overlap"] is bool(flag)
        assert split["calibration"]["part"] == "train" and split["calibration"]["chars"] == [3200, 6400]


def test_fault_table_is_large_enough():
    commands = {c[1][0] for c in CASES}
    assert len(CASES) >= 60
    assert {"compress", "repair", "analyze", "eval", "bench", "profile", "demo", "report"} <= commands


# ----------------------------------------------------------------------------- contracts
def test_demo_out_dot_keeps_files(tmp_path, monkeypatch, capsys):
    """The issue's worst case: `gac demo --out .` in a directory with files in it."""
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("beta")
    monkeypatch.chdir(tmp_path)
    for extra in ([], ["--overwrite"]):
        assert main(["demo", "--out", ".", *extra]) == 2
    assert (tmp_path / "a.txt").read_text() == "alpha" and (tmp_path / "sub" / "b.txt").read_text() == "beta"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "sub"]


def test_overwrite_file_out_replaces_it_and_leaks_nothing(base, tmp_path, capsys):
    f = tmp_path / "was_a_file"
    f.write_text("old")
    assert main(["compress", str(base["tiny"]), *SVD, "--overwrite", "--out", str(f)]) == 0
    assert (f / "model.safetensors").is_file() and not _leaks(tmp_path)


def test_outputs_get_umask_permissions(base, tmp_path, capsys):
    old = os.umask(0o022)
    try:
        out = tmp_path / "o"
        assert main(["compress", str(base["tiny"]), *SVD, "--out", str(out)]) == 0
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o755
    for p in out.iterdir():
        assert p.stat().st_mode & 0o777 == 0o644, p


def test_same_seed_same_bytes(base, tmp_path, capsys):
    """Determinism: the same command writes byte-identical safetensors (svd and calibrated asvd)."""
    for comp in (["-c", "svd"], ["-c", "asvd", "-O", "probe_ratios=0.8,0.9", "--n-samples", "2"]):
        outs = []
        for i in range(2):
            out = tmp_path / f"{comp[1]}{i}"
            args = ["compress", str(base["tiny"]), *comp, "-r", "0.9", "--profile", "default"]
            args += ["--calib", f"text:{base['root'] / 'english.txt'}", "--seq-len", "64", "--out", str(out)]
            assert main(args) == 0, capsys.readouterr().err
            outs.append((out / "model.safetensors").read_bytes())
        assert outs[0] == outs[1], comp


def test_internal_error_is_one_line_unless_debug(base, tmp_path, monkeypatch, capsys):
    import gac.api

    def boom(*a, **k):
        raise RuntimeError("simulated bug\nsecond line")

    monkeypatch.setattr(gac.api, "compress_", boom)
    args = ["compress", str(base["tiny"]), *SVD, "--out", str(tmp_path / "o")]
    monkeypatch.delenv("GAC_DEBUG", raising=False)
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: internal error: RuntimeError: simulated bug second line")
    assert "GAC_DEBUG=1" in err[-1] and not any("Traceback" in ln for ln in err)
    monkeypatch.setenv("GAC_DEBUG", "1")
    assert main(args) == 1
    assert "Traceback" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not _leaks(tmp_path)


def test_lm_eval_all_tasks_failed_is_nonzero(tmp_path, capsys, monkeypatch):
    import gac.eval.lm_eval_bridge as bridge
    import gac.llm_eval as le

    d = tmp_path / "m"
    tiny_model("llama").save_pretrained(d)
    char_tokenizer().save_pretrained(d)
    monkeypatch.setattr(bridge, "check_tasks", lambda tasks, tm: None)
    monkeypatch.setattr(bridge, "task_manager", lambda include: None)

    def all_fail(model, tok, tasks, out_json=None, **kw):
        res = {"tasks": {}, "errors": {t: "RuntimeError: boom" for t in tasks}}
        Path(out_json).write_text(json.dumps(res))
        return res

    monkeypatch.setattr(bridge, "run_lm_eval", all_fail)
    rc = main(["eval", "lm_eval", "--variant", "baseline", "--baseline-model-id", str(d),
               "--tasks", "piqa,arc_easy", "--out", str(tmp_path / "r")])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "every lm-eval task failed" in err
    assert le is not None


def test_profile_quick_writes_nothing_in_cwd(tmp_path, monkeypatch, capsys):
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    out = tmp_path / "p" / "cpu.json"
    import gac.hardware.profiler as profiler

    calls = {}

    def fake_build(dtype, quick, device, results_dir, tolerance):
        calls["results_dir"] = Path(results_dir)
        from gac.hardware.profile import default_profile

        return default_profile(dtype)

    monkeypatch.setattr(profiler, "build_profile", fake_build)
    monkeypatch.setattr(profiler, "write_profile_outputs", lambda prof, o, r: prof.save(o))
    assert main(["profile", "--quick", "--device", "cpu", "--out", str(out)]) == 0
    assert list(work.iterdir()) == []
    assert calls["results_dir"] == out.parent / "cpu-raw"


# ----------------------------------------------------------------------------- signals
# A subprocess runs gac with one function patched to announce it has started (a file appears)
# and then wait; the test signals it there. Writing starts before the wait for the "save" stage,
# so SIGKILL leaves a real half-written temporary behind.
DRIVER = textwrap.dedent(
    """
    import os, sys, time, importlib
    stage, ready = sys.argv[1], sys.argv[2]
    mod_name, attr = {
        "compute": ("gac.api", "compress_"),
        "save": ("safetensors.torch", "save_file"),
        "ppl": ("gac.eval.ppl", "perplexity"),
        "repair": ("gac.surgery.repair", "repair_"),
        "bench": ("gac.hardware.sweeps", "run_experiment"),
    }[stage]
    mod = importlib.import_module(mod_name)
    real = getattr(mod, attr)
    def slow(*a, **k):
        if stage == "save":
            real(*a, **k)
        open(ready, "w").close()
        time.sleep(60)
        return real(*a, **k)
    setattr(mod, attr, slow)
    if stage in ("compute", "ppl", "repair"):
        import gac.commands.compress, gac.commands.eval, gac.commands.repair  # noqa: F401
    from gac.cli import main
    sys.exit(main(sys.argv[3:]))
    """
)


def _spawn(tmp_path: Path, stage: str, argv: list[str]) -> tuple[subprocess.Popen, Path]:
    ready = tmp_path / f"ready-{stage}"
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "GAC_NO_PROGRESS": "1"}
    env.pop("GAC_DEBUG", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, stage, str(ready), *argv],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    t0 = time.time()
    while not ready.exists():
        if proc.poll() is not None:
            raise AssertionError(f"exited early {proc.returncode}: {proc.stderr.read()}")
        assert time.time() - t0 < 120, "the stage was never reached"
        time.sleep(0.05)
    return proc, ready


_SIGNAL_CASES = [
    ("compress-compute", "compute", ["compress", "{tiny}", *SVD, "--out", "{out}"]),
    ("compress-save", "save", ["compress", "{tiny}", *SVD, "--out", "{out}"]),
    ("repair", "repair", ["repair", "{tiny}", "-s", "optimal", "--profile", "default", "--out", "{out}"]),
    (
        "eval-ppl",
        "ppl",
        [
            "eval",
            "ppl",
            "{tiny}",
            "--dataset",
            "text:{root}/english.txt",
            "--seq-len",
            "64",
            "--out",
            "{out}.json",
        ],
    ),
    ("bench", "bench", ["bench", "-e", "gemv", "--device", "cpu", "--out", "{out}"]),
]
# Each case starts two Python processes (~5 s each on the shared CPU): the fast tier keeps the save
# stage (the one that can leave a half-written output behind); the others run with -m slow.
SIGNAL_CASES = [
    pytest.param(c, id=c[0], marks=() if c[0] == "compress-save" else pytest.mark.slow) for c in _SIGNAL_CASES
]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
@pytest.mark.parametrize("case", SIGNAL_CASES)
def test_signal_mid_run_then_rerun(case, sig, base, tmp_path):
    name, stage, args = case
    if sig == signal.SIGKILL and stage in ("bench",):
        pytest.skip("bench's raw JSONL is resumable by design (--resume); nothing atomic to check")
    argv = _fill(args, {**base, "out": tmp_path / "out"})
    proc, _ = _spawn(tmp_path, stage, argv)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    out = tmp_path / "out"
    if sig == signal.SIGINT:
        assert proc.returncode == 130, err
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        assert lines[-1].startswith("error: interrupted by SIGINT") and "Traceback" not in err, err
        assert not _leaks(tmp_path), _leaks(tmp_path)
    else:
        assert proc.returncode == -signal.SIGKILL
        if stage == "save":
            assert _leaks(tmp_path), "the kill should have left a half-written temporary"
    assert not out.exists() and not Path(f"{out}.json").exists()
    if stage == "bench":
        return  # the re-run of a CPU sweep is covered by tests/hardware
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "GAC_NO_PROGRESS": "1"}
    rerun = subprocess.run(
        [sys.executable, "-m", "gac", *argv], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert rerun.returncode == 0, rerun.stderr
    assert not _leaks(tmp_path), "the re-run must remove the killed run's temporary"


def test_report_reads_demo_json(tmp_path, capsys):
    d = tmp_path / "runs" / "demo"
    d.mkdir(parents=True)
    rows = [
        {"variant": "base", "params": 1000, "targeted_ratio": 1.0, "pct_aligned": None, "ppl": 10.0},
        {"variant": "gac", "params": 900, "targeted_ratio": 0.9, "pct_aligned": 100.0, "ppl": 11.5,
         "predicted_speedup": 1.234, "measured_prefill_speedup": 1.111, "measured_decode_speedup": 1.05},
    ]  # fmt: skip
    (d / "demo.json").write_text(json.dumps({"schema": "gac.demo/1", "rows": rows}))
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0, (
        capsys.readouterr().err
    )
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| gac |" in md and "11.500" in md and "100.0" in md
    gac_row = next(ln for ln in md.splitlines() if ln.startswith("| gac |"))
    assert "| 1.23 | 1.11 | 1.05 |" in gac_row  # predicted, measured prefill, measured decode: no "–"


def test_infer_sweep_with_every_point_failed_is_nonzero(tmp_path, capsys, monkeypatch):
    import gac.eval.infer as infer

    d = tmp_path / "m"
    tiny_model("llama").save_pretrained(d)

    def all_oom(variants, cfg, dev):
        pts = [{"phase": "prefill", "batch": 1, "seq": 8, "status": "oom", "error": "CUDA out of memory"}]
        return {"variants": {"baseline": {"prefill": pts, "decode": []}}}

    monkeypatch.setattr(infer, "run_sweep", all_oom)
    monkeypatch.setattr(infer, "write_results", lambda res, out, plots=True: None)
    rc = main(
        ["eval", "infer", "--baseline-model-id", str(d), "--device", "cpu", "--out", str(tmp_path / "r")]
    )
    assert rc == 2 and "every point of the sweep failed (oom)" in capsys.readouterr().err


def test_progress_lines_in_a_log(monkeypatch, capsys):
    """stderr is not a terminal: plain lines (start with the amount of work, periodic, final)."""
    from gac.utils import track

    monkeypatch.setenv("GAC_NO_PROGRESS", "0")
    monkeypatch.setenv("GAC_PROGRESS_INTERVAL", "0")
    assert list(track(range(4), "asvd sensitivity: 2 sites x 2 ratios = 4 probes")) == [0, 1, 2, 3]
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "asvd sensitivity: 2 sites x 2 ratios = 4 probes: 4 steps"
    assert lines[1].startswith("asvd sensitivity: 2 sites x 2 ratios = 4 probes: 1/4 (25%)")
    assert "4/4 (100%)" in lines[-1] and len(lines) == 5
    monkeypatch.setenv("GAC_NO_PROGRESS", "1")
    list(track(range(3), "quiet"))
    assert capsys.readouterr().err == ""
