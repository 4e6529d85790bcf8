"""The serving engine against transformers' generate, and its policies against each other, on one trace:
the engine section of ``bench_serving.py``, run alone.

    .venv/bin/python benchmarks/bench_engine.py [--size small|large] [--requests 48] [--batch 16] [--tp 1]
                                                [--vllm-python /path/to/vllm/python]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serving import main  # noqa: E402  (beside this file)

if __name__ == "__main__":
    main(["--section", "engine", *sys.argv[1:]])
