"""The CLI's one vocabulary: each recurring option declared once, with one name, short flag and help.

A command that has one of these options takes it from here (``device: Annotated[str, DEVICE()] =
"auto"``); only the default (and the panel it shows in) is the command's own, because the default
is what differs between commands, not the meaning. A short flag exists only on an option declared
here and means that option in every command that offers it. ``tests/test_cli_vocabulary.py`` walks every command
and fails where a long option is spelled, flagged or explained two ways.

The fast path's switches (``--compile``, ``--gemv``...) are declared once elsewhere, in
:class:`gac.runtime.FastPath`, and generated from it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from gac.errors import GacError


@dataclass(frozen=True)
class Opt:
    """One recurring option: its names (long first, then the short flag) and its help."""

    names: tuple[str, ...]
    help: str

    @property
    def long(self) -> str:
        return self.names[0]

    def __call__(
        self, *, panel: str | None = None, shown_default: str | bool = True, short: bool = True
    ) -> Any:
        """The typer option, for ``Annotated[type, OPT()]``.

        Args:
            panel: the ``--help`` panel it shows in (None: the command's main options).
            shown_default: the default ``--help`` names where the signature's is None because it
                depends on the machine (``"256 GPU / 32 CPU"``).
            short: False leaves the short flag out, where a command gave it another meaning before
                (``gac compress -o`` was ``--option``): an old command line is refused, not misread.
        """
        names = self.names if short else self.names[:1]
        return typer.Option(*names, help=self.help, rich_help_panel=panel, show_default=shown_default)


#: Every option declared here, by long name.
SHARED: dict[str, Opt] = {}


def _opt(*names: str, help: str) -> Opt:
    o = Opt(names, help)
    SHARED[o.long] = o
    return o


MODEL = Annotated[
    str, typer.Argument(help="Model: alias (smollm2), HF or gac directory, .gguf file or hub id.")
]

# what to compress, and how
COMPRESSOR = _opt("--compressor", "-c", help="Compressor: svd, asvd, svd-llm, llm-pruner or palu.")
PARAM_RATIO = _opt(
    "--param-ratio",
    "-r",
    help="Fraction of the targeted weights' parameters to keep, in (0, 1) (palu: of the KV cache).",
)
ALIGN = _opt("--align", "-a", help="none | round | knapsack (unaligned control) | gac | gac-latency.")
OPTION = _opt("--option", "-O", help="Compressor option KEY=VALUE (repeatable).")
STRATEGY = _opt("--strategy", "-s", help="minimal (x8), optimal (x16) or profile (the profile's rules).")
PROFILE = _opt(
    "--profile",
    "-p",
    help="Hardware profile: a JSON path, a shipped id, 'default' (built in) or 'auto' (this GPU's shipped one).",
)

# text: calibration and evaluation
CALIB = _opt(
    "--calib",
    help="Calibration text: britannica | wikitext2 | c4 | text:PATH (its calibration part; "
    "text:PATH@all for the whole file).",
)
N_SAMPLES = _opt("--n-samples", help="Calibration windows.")
SEQ_LEN = _opt("--seq-len", help="Tokens per sequence (window).")
BATCH_SIZE = _opt("--batch-size", help="Sequences per forward pass.")
DATASET = _opt(
    "--dataset",
    "-d",
    help="Evaluation text: britannica (embedded) | wikitext2 | c4 (need the hub) | text:PATH (its "
    "test part; text:PATH@calib / @all pick another).",
)
ALLOW_OVERLAP = _opt(
    "--allow-overlap",
    help="Evaluate even on text the model was calibrated on (recorded in the result).",
)
MAX_WINDOWS = _opt("--max-windows", help="Score only the first N windows.")
TOKENIZER = _opt("--tokenizer", help="Take the tokenizer from this model spec.")
TRUST_REMOTE_CODE = _opt("--trust-remote-code", help="Allow the model's own Python code (off by default).")

# variants (gac eval)
VARIANT = _opt("--variant", help="baseline | a model directory | SPEC (asvd:0.85:gac).")
BASELINE_MODEL_ID = _opt(
    "--baseline-model-id",
    help="Base model: alias (smollm2), HF id, directory or GGUF (eval infer times it first).",
)

# the machine
DEVICE = _opt("--device", help="auto (CUDA where available, else CPU) | cpu | cuda | cuda:N.")
DTYPE = _opt("--dtype", help="auto (bfloat16 on GPU, float32 on CPU) | float32 | bfloat16 | float16.")
MAX_GPU_MEMORY = _opt(
    "--max-gpu-memory",
    help="GiB the model may occupy on the GPU. compress: a larger model stays in CPU memory and is "
    "compressed one decoder layer at a time on the GPU (svd, svd-llm); eval infer: the budget "
    "--capacity-context fills (default: this GPU's free memory).",
)
MAX_MEMORY = _opt(
    "--max-memory",
    help="accelerate's max_memory: spread the model over devices, whole decoder layers each: "
    "'0=20GiB,1=20GiB,cpu=64GiB[,disk=200GiB]'.",
)

# outputs
OUT = _opt("--out", "-o", help="Output path, written atomically (the command's description says what).")
OVERWRITE = _opt("--overwrite", help="Replace an existing --out.")
JSON = _opt("--json", help="Print the result as JSON on stdout instead of text.")

# measurement
EXPERIMENT = _opt(
    "--experiment",
    "-e",
    help="sdpa_sweep, sdpa_backend, gemm_projection, gemv, lowrank, padding_rescue, repair_kernels, "
    "latent_attention (PaLU's decode kernel, CUDA) or all.",
)
HALF_WINDOW = _opt(
    "--half-window", help="Half-width H of a stride-1 sweep around each dim d: from d - H to d + H."
)
MAX_NEW_TOKENS = _opt("--max-new-tokens", "-n", help="Tokens to generate.")

#: Each short flag and the long option it means, in every command.
SHORT_FLAGS: dict[str, str] = {n: o.long for o in SHARED.values() for n in o.names[1:]}


def renamed(old: Any, old_name: str, new: Any, new_name: str, new_default: Any = None) -> Any:
    """The value of an option renamed to ``new_name`` given either way: the old spelling stays as a
    hidden alias where committed scripts or docs used it, and a notice names the new one."""
    if old is None:
        return new
    if new != new_default:
        raise GacError(f"{old_name} is the old spelling of {new_name}; give only {new_name}")
    from gac.utils import console

    console.print(f"notice: {old_name} is now {new_name}", markup=False)
    return old


def call(fn: Callable[..., Any], params: dict[str, Any], **given: Any) -> Any:
    """Call the library function ``fn`` with the command's ``params`` it takes by name, and ``given``.

    A command names its options after the arguments of the one library function it calls, so the
    command passes them on without restating each (``given``: those it parsed or renamed). A ``fn``
    that takes ``**kwargs`` gets every one of ``params``.
    """
    sig = inspect.signature(fn).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.values())
    return fn(**{k: v for k, v in params.items() if (takes_all or k in sig) and k not in given}, **given)
