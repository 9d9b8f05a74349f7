"""Render a `specrt bench --json` result as its Markdown section again (what `--markdown` writes), e.g. when a
later step of scripts/make_benchmarks.sh failed after this one had measured.

    python scripts/render_benchmark.py benchmarks/demo.json "Demo pair: ..." benchmarks/demo.png OUT.md
"""

import json
import sys
from pathlib import Path

from specrt.bench.report import markdown


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    result_path, title, plot, out = argv
    result = json.loads(Path(result_path).read_text(encoding="utf-8"))
    rel = None
    if plot != "-":
        rel = str(Path(plot).resolve().relative_to(Path(out).resolve().parent))
    Path(out).write_text(markdown(result, title, plot=rel) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
