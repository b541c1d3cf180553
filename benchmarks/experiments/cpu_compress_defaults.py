"""Wall time of ``gac compress smollm2 --out DIR`` with the defaults on this CPU (issue 14's target).

Runs the CLI in a subprocess with stderr to a log (not a terminal, so the progress lines are the
plain ones a log shows), then writes ``benchmarks/results/cpu/compress_smollm2_defaults.json``
with the command, wall time, exit status, the log's progress lines and the environment.

    OMP_NUM_THREADS=1 PYTHONPATH=src python3 benchmarks/experiments/cpu_compress_defaults.py
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    out_json = ROOT / "benchmarks" / "results" / "cpu" / "compress_smollm2_defaults.json"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "smollm2-asvd"
        cmd = [sys.executable, "-m", "gac", "compress", "smollm2", "--out", str(out)]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "GAC_PROGRESS_INTERVAL": "60"}
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        saved = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    import torch

    doc = {
        "schema": "gac.bench.cpu_compress_defaults/1",
        "command": "OMP_NUM_THREADS=1 gac compress smollm2 --out DIR",
        "runner": "OMP_NUM_THREADS=1 PYTHONPATH=src python3 benchmarks/experiments/cpu_compress_defaults.py",
        "exit_status": proc.returncode,
        "wall_s": round(wall, 1),
        "saved_files": saved,
        # progress and notes (stderr), without the result tables; the tables' tail (stdout)
        "stderr_lines": [ln for ln in proc.stderr.splitlines() if ln[:1] not in "│┃┏┡└┗╭╰"][-120:],
        "stdout_tail": proc.stdout.splitlines()[-25:],
        "env": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "load_avg_at_end": os.getloadavg(),
            "note": "shared 2-core machine: six other jobs may have run at the same time",
        },
    }
    out_json.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"exit {proc.returncode}, {wall:.0f} s -> {out_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
