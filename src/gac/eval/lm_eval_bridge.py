"""Downstream accuracy through lm-evaluation-harness 0.4.x, around a model gac already loaded.

The loaded ``nn.Module`` (dense, compressed in place, or loaded from a gac directory) is
wrapped by lm-eval's own Hugging Face wrapper, ``HFLM(pretrained=<model instance>,
tokenizer=...)``, so every task is scored exactly as ``lm-eval --model hf`` scores it.
Tasks run one at a time and the results are written after each task, so a failure later
(a dataset that cannot be fetched, say) keeps the tasks already measured.

Default tasks: :data:`DEFAULT_TASKS`, full sets unless ``limit`` is given.  Local tasks
(a task YAML plus a local dataset file) are found through ``include_path``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from torch import nn

from gac.errors import GacError
from gac.utils import atomic_write_text, console

SCHEMA = "gac.lm_eval/1"
DEFAULT_TASKS: tuple[str, ...] = ("piqa", "hellaswag", "arc_easy", "arc_challenge", "winogrande")
#: the metrics kept per task (others are kept too, but these head the report)
HEADLINE = ("acc_norm", "acc")


def _lm_eval():
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise GacError(
            "lm-eval is not installed: pip install 'gac[eval]' (or pip install 'lm-eval>=0.4,<0.5')"
        ) from None
    return lm_eval, HFLM, TaskManager


def task_manager(include_path: str | Path | list[str | Path] | None = None) -> Any:
    """lm-eval's task index, with local task folders added."""
    _, _, TaskManager = _lm_eval()
    paths = include_path if isinstance(include_path, list) else ([include_path] if include_path else None)
    if paths:
        for p in paths:
            if not Path(p).is_dir():
                raise GacError(f"--include-path {p} is not a directory of lm-eval task YAML files")
    return TaskManager(include_path=[str(p) for p in paths] if paths else None)


def check_tasks(tasks: list[str], tm: Any) -> None:
    """Raise a clear :class:`GacError` naming every task lm-eval does not know."""
    if not tasks:
        raise GacError("no lm-eval task given")
    known = set(tm.all_tasks)
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise GacError(
            f"unknown lm-eval task(s): {', '.join(unknown)}; list the task names with `lm-eval ls tasks` "
            "(local tasks: add their folder with --include-path)"
        )


def _headline(metrics: dict[str, Any]) -> tuple[str | None, float | None, float | None]:
    for name in HEADLINE:
        key = f"{name},none"
        if key in metrics and isinstance(metrics[key], (int, float)):
            se = metrics.get(f"{name}_stderr,none")
            return name, float(metrics[key]), (float(se) if isinstance(se, (int, float)) else None)
    return None, None, None


def run_lm_eval(
    model: nn.Module,
    tokenizer: Any,
    tasks: list[str] | tuple[str, ...] = DEFAULT_TASKS,
    *,
    limit: int | float | None = None,
    batch_size: int = 8,
    num_fewshot: int | None = None,
    include_path: str | Path | list[str | Path] | None = None,
    out_json: str | Path | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Score ``model`` on lm-eval ``tasks`` and return (and optionally write) the results.

    Args:
        model: a Hugging Face causal LM instance (any module ``HFLM`` accepts).
        tokenizer: its tokenizer.
        tasks: lm-eval task names; all are checked before any is run.
        limit: examples per task (None: the full sets).
        batch_size: lm-eval batch size.
        num_fewshot: few-shot examples (None: each task's default, 0 for the defaults).
        include_path: folder(s) of local task YAMLs.
        out_json: where to write the results after every task (atomically).
        meta: recorded as is (variant, model id...).

    Raises:
        GacError: lm-eval missing, an unknown task name, or no tokenizer.
    """
    lm_eval, HFLM, _ = _lm_eval()
    if tokenizer is None:
        raise GacError("lm-eval needs the model's tokenizer, and none was found with this model")
    tasks = list(tasks)
    tm = task_manager(include_path)
    check_tasks(tasks, tm)
    dev = next(model.parameters()).device
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=str(dev))
    res: dict[str, Any] = {
        "schema": SCHEMA,
        "lm_eval_version": getattr(lm_eval, "__version__", None),
        "tasks": {},
        "errors": {},
        "limit": limit,
        "num_fewshot": num_fewshot,
        "batch_size": batch_size,
        "meta": meta or {},
    }
    for task in tasks:
        t0 = time.perf_counter()
        console.print(f"lm-eval: {task} ({'full set' if limit is None else f'limit {limit}'})")
        try:
            out = lm_eval.simple_evaluate(
                model=lm,
                tasks=[task],
                limit=limit,
                num_fewshot=num_fewshot,
                task_manager=tm,
                log_samples=False,
                bootstrap_iters=1000,
                verbosity="ERROR",
            )
        except Exception as e:  # noqa: BLE001 - one task's failure keeps the others' results
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            res["errors"][task] = f"{type(e).__name__}: {msg}"[:400]
            console.print(f"[yellow]warning[/yellow]: lm-eval task {task} failed: {res['errors'][task]}")
            if out_json:
                atomic_write_text(Path(out_json), json.dumps(res, indent=1, default=str))
            continue
        for name, metrics in (out or {}).get("results", {}).items():
            clean = {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}
            metric, value, stderr = _headline(clean)
            res["tasks"][name] = {
                "metric": metric,
                "value": value,
                "stderr": stderr,
                "n_samples": (out.get("n-samples", {}).get(name, {}) or {}).get("effective"),
                "metrics": clean,
                "seconds": time.perf_counter() - t0,
            }
        if out_json:
            atomic_write_text(Path(out_json), json.dumps(res, indent=1, default=str))
    accs = [t["value"] for t in res["tasks"].values() if t["value"] is not None]
    res["mean_acc"] = sum(accs) / len(accs) if accs else None
    if out_json:
        atomic_write_text(Path(out_json), json.dumps(res, indent=1, default=str))
    return res


#: A local lm-eval task scoring one text file as one document by rolling loglikelihood.
_ROLLING_TASK = """task: {name}
dataset_path: text
dataset_kwargs:
  data_files:
    test: "{path}"
  sample_by: document
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
"""


def lm_eval_perplexity(
    model: nn.Module | str, tokenizer: Any, text: str, seq_len: int, batch_size: int = 1
) -> dict[str, Any]:
    """lm-eval's own rolling-loglikelihood perplexity of ``text``, per token, to set beside gac's.

    ``text`` is written to a file and scored as one document by a local ``loglikelihood_rolling``
    task (``datasets``' ``text`` builder, offline) through ``HFLM(pretrained=model,
    max_length=seq_len)``: lm-eval encodes it with the tokenizer's defaults and scores every token
    in windows of ``seq_len``. Its ``byte_perplexity`` gives the summed log-likelihood, divided
    here by the token count.

    Args:
        model: a loaded causal LM or a local model directory (HFLM loads it).
        tokenizer: the tokenizer (or None to let HFLM load the directory's own).
        text: the document.
        seq_len: lm-eval's ``max_length``: the window length.
        batch_size: windows per forward pass.

    Returns:
        ``ppl`` (per token), ``n_tokens``, ``loglikelihood``, lm-eval's ``byte_perplexity``,
        ``word_perplexity`` and ``n_bytes``.
    """
    import math
    import tempfile

    lm_eval, HFLM, TaskManager = _lm_eval()
    with tempfile.TemporaryDirectory(prefix="gac-lm-eval-") as tmp:
        data = Path(tmp) / "doc.txt"
        data.write_text(text, encoding="utf-8")
        (Path(tmp) / "gac_rolling_ppl.yaml").write_text(
            _ROLLING_TASK.format(name="gac_rolling_ppl", path=str(data))
        )
        kw: dict[str, Any] = {"tokenizer": tokenizer} if tokenizer is not None else {}
        if isinstance(model, str):
            import torch

            kw["device"] = "cuda" if torch.cuda.is_available() else "cpu"
        else:
            kw["device"] = str(next(model.parameters()).device)
        lm = HFLM(pretrained=model, max_length=seq_len, batch_size=batch_size, **kw)
        out = lm_eval.simple_evaluate(
            model=lm,
            tasks=["gac_rolling_ppl"],
            task_manager=TaskManager(include_path=tmp),
            log_samples=False,
            verbosity="ERROR",
        )
        n_tokens = len(lm.tok_encode(text))
    m = out["results"]["gac_rolling_ppl"]
    n_bytes = len(text.encode("utf-8"))
    ll = -n_bytes * math.log(m["byte_perplexity,none"])
    return {
        "ppl": math.exp(-ll / n_tokens),
        "n_tokens": n_tokens,
        "loglikelihood": ll,
        "byte_perplexity": m["byte_perplexity,none"],
        "word_perplexity": m["word_perplexity,none"],
        "n_bytes": n_bytes,
        "seq_len": seq_len,
    }
