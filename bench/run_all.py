"""Run every benchmark (``make bench``) and collect their tables in bench/results/.

Each bench_*.py is run as its own process (so one's memory and imports don't
skew another's), inside the throwaway namespaces it creates itself.  Output is
printed and saved to bench/results/<name>.md; docs/benchmarks.md records the
figures and the exact command.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(names: list[str]) -> int:
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    scripts = sorted(HERE.glob("bench_*.py"))
    if names:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in names or s.stem in names]
    failed = []
    for script in scripts:
        print(f"\n### {script.stem}", flush=True)
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              cwd=HERE.parent, timeout=1800)
        print(proc.stdout, end="")
        (results / f"{script.stem}.md").write_text(proc.stdout)
        if proc.returncode != 0:
            failed.append(script.stem)
            print(proc.stderr[-3000:], file=sys.stderr)
        print(f"({script.stem}: {time.monotonic() - t0:.1f}s, exit {proc.returncode})", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
