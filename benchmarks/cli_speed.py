"""How long a ``cswap`` command takes before it does anything: startup against ``python -c pass``.

Times ``cswap --help``, ``cswap train --help`` and ``cswap configs list`` (a fresh ``CSWAP_HOME``,
so an empty store) as whole processes, interleaved round by round with ``python -c pass`` from
the same interpreter so that load on the machine hits all of them alike, and reports each
command's median wall seconds and its ratio to the baseline's median. A help text or a table of
the store needs none of torch, numba or scikit-learn; what they import is listed too.

Output: one JSON line per command (``--json``: only those lines).

Example:
    $ python benchmarks/cli_speed.py --rounds 9 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


__all__ = ["COMMANDS", "main", "measure"]

#: What a newcomer runs first, and what each may import.
COMMANDS: dict[str, list[str]] = {
    "cswap --help": ["--help"],
    "cswap train --help": ["train", "--help"],
    "cswap configs list": ["configs", "list"],
}
#: The heavy libraries none of these commands should load.
HEAVY = ("torch", "numba", "sklearn", "scipy")
#: The issue's target: ``cswap --help`` at most this many times ``python -c pass``.
TARGET_RATIO = 8.0


def _cli() -> list[str]:
    return [sys.executable, "-c", "import sys; from cswap.cli import main; sys.argv[0] = 'cswap'; main()"]


def _wall(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def _heavy_imports(args: list[str], env: dict[str, str]) -> list[str]:
    probe = ("import sys, runpy; from cswap.cli import main; sys.argv = ['cswap', *sys.argv[1:]]\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             f"print('\\n' + ','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe, *args], env=env, capture_output=True, text=True, check=False)
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    return [m for m in last.split(",") if m in HEAVY]


def measure(rounds: int = 9) -> list[dict[str, object]]:
    """Median wall seconds of each command and of ``python -c pass``, interleaved over ``rounds``."""
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "CSWAP_HOME": home}
        baseline_command = [sys.executable, "-c", "pass"]
        times: dict[str, list[float]] = {name: [] for name in COMMANDS}
        baseline: list[float] = []
        for args in COMMANDS.values():  # warm-up: the page cache, __pycache__
            _wall([*_cli(), *args], env)
        for _ in range(rounds):
            baseline.append(_wall(baseline_command, env))
            for name, args in COMMANDS.items():
                times[name].append(_wall([*_cli(), *args], env))
        base = statistics.median(baseline)
        return [
            {
                "command": name,
                "median_s": round(statistics.median(times[name]), 4),
                "python_pass_median_s": round(base, 4),
                "ratio_to_python_pass": round(statistics.median(times[name]) / base, 2),
                "target_ratio": TARGET_RATIO if name == "cswap --help" else None,
                "heavy_imports": _heavy_imports(COMMANDS[name], env),
                "rounds": rounds,
                "python": sys.version.split()[0],
                "cpus": os.cpu_count(),
                "date": time.strftime("%Y-%m-%d"),
            }
            for name in COMMANDS
        ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (medians over them)")
    parser.add_argument("--json", action="store_true", help="only the JSON lines")
    args = parser.parse_args(argv)
    rows = measure(args.rounds)
    for row in rows:
        print(json.dumps(row))
    if not args.json:
        for row in rows:
            print(f"{row['command']:<22} {row['median_s']:.3f} s  {row['ratio_to_python_pass']:.1f}x python -c pass  "
                  f"heavy imports: {', '.join(row['heavy_imports']) or 'none'}", file=sys.stderr)


if __name__ == "__main__":
    main()
    sys.exit(0)
