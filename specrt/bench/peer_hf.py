"""`--peer hf`: Hugging Face transformers on the same checkpoints, prompts and token budget.

Three peers, PyTorch fp32 on the bundle's device, `torch.set_num_threads` = ONNX Runtime's thread count:

    plain      generate(do_sample=False)
    assisted   generate(assistant_model=draft), per integer k: num_assistant_tokens=k with the "constant"
               schedule and no confidence early-stop; for k=auto transformers' own defaults (dynamic)
    lookup     generate(prompt_lookup_num_tokens=k), per integer k

Reported per peer and suite: end-to-end tokens/s (median over repeats of the geometric mean over
prompts, as for our rows), the ratio ours / theirs against our matching row (plain, draft k, ngram k),
and token agreement: the fraction of positions where their greedy output equals ours.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from specrt.core.errors import InvalidArgument
from specrt.bench import predict
from specrt.bench.peer_common import agreement, mean_over, per_repeat


def checkpoints(gen, settings) -> tuple[Path, Path | None]:
    if settings.target_checkpoint is not None:
        return Path(settings.target_checkpoint), (Path(settings.draft_checkpoint) if settings.draft_checkpoint else None)
    demo = gen.manifest.demo
    if demo is not None and demo.models:
        models = Path(demo.models)
        draft = models / "draft"
        return models / "target", (draft if (draft / "config.json").exists() else None)
    raise InvalidArgument("--peer hf needs the Hugging Face checkpoints the bundle was compiled from: pass "
                          "--target-checkpoint DIR (and --draft-checkpoint DIR); only the demo bundle records them")


def peer_configs(settings, has_draft: bool) -> list[tuple[str, int | str]]:
    out: list[tuple[str, int | str]] = [("plain", 0)]
    if settings.simulate:
        return out
    methods = settings.methods or ("draft", "ngram")
    if has_draft and "draft" in methods:
        out += [("assisted", k) for k in settings.ks]
    if "ngram" in methods:
        out += [("lookup", k) for k in settings.ks if k != "auto"]
    return out


def count_runs(settings, n_prompts: int, has_draft: bool = True) -> int:
    return n_prompts * (1 + settings.repeats * len(peer_configs(settings, has_draft)))


def _load(path: Path, device: str):
    import transformers as tf

    try:
        import torch

        model = tf.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"transformers could not load the checkpoint {path}: {exc}") from None
    return model.to(device).eval()


def _generate(model, draft, ids, kind: str, k, settings, eos: list[int]):
    import torch

    kw: dict[str, Any] = dict(max_new_tokens=settings.max_new_tokens, do_sample=settings.temperature > 0,
                              eos_token_id=eos or None, pad_token_id=eos[0] if eos else None)
    if settings.temperature > 0:
        kw["temperature"] = settings.temperature
    if kind == "assisted":
        gc = draft.generation_config
        if k == "auto":
            gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = 20, "constant", 0.4
        else:
            gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = int(k), "constant", 0.0
        kw["assistant_model"] = draft
    elif kind == "lookup":
        kw["prompt_lookup_num_tokens"] = int(k)
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        dt = time.perf_counter() - t0
    return out[0, ids.shape[1]:].tolist(), dt


def run_peer(gen, settings, prompts, prompt_ids, references, rows, progress: Callable[[str], None] | None = None):
    import torch
    import transformers as tf

    tick = progress or (lambda desc: None)
    tf.utils.logging.set_verbosity_error()  # no weight-loading bars or deprecation chatter inside the progress bar
    tf.utils.logging.disable_progress_bar()
    target_dir, draft_dir = checkpoints(gen, settings)
    device = "cuda" if gen.backend in ("trt", "ort-cuda", "ort-trt") and torch.cuda.is_available() else "cpu"
    ort_threads = gen.target.describe().get("threads")
    torch_threads_before = torch.get_num_threads()
    if ort_threads:
        torch.set_num_threads(int(ort_threads))
    try:
        model = _load(target_dir, device)
        draft = _load(draft_dir, device) if draft_dir is not None else None
        configs = peer_configs(settings, draft is not None)
        eos = sorted(gen.eos_ids)
        ids = [torch.as_tensor(p, dtype=torch.long, device=device)[None, :] for p in prompt_ids]
        for i, p in enumerate(prompts):  # warm-up
            tick(f"peer warm-up {p.suite} #{i}")
            _generate(model, draft, ids[i], "plain", 0, settings, eos)
        timings: dict[tuple, list[tuple[str, int, float]]] = {c: [] for c in configs}
        agree: dict[tuple, list[float]] = {c: [] for c in configs}
        for r in range(settings.repeats):
            for i, p in enumerate(prompts):
                for kind, k in configs:
                    tick(f"peer repeat {r + 1}/{settings.repeats} {p.suite} #{i} {kind} k={k}")
                    out, dt = _generate(model, draft, ids[i], kind, k, settings, eos)
                    timings[(kind, k)].append((p.suite, r, len(out) / dt if dt > 0 else 0.0))
                    if r == 0:
                        agree[(kind, k)].append(agreement(references[i], out))
        threads_used = torch.get_num_threads()
    finally:
        torch.set_num_threads(torch_threads_before)
    results = []
    ours_by = {(row["method"], row["k"], row["suite"]): row for row in rows}
    ours_name = {"plain": "none", "assisted": "draft", "lookup": "ngram"}
    suite_names = list(dict.fromkeys(p.suite for p in prompts))
    for (kind, k), samples in timings.items():
        for suite in [*suite_names, "overall"]:
            tps = predict.spread(per_repeat([s for s in samples if suite == "overall" or s[0] == suite]))
            ours = ours_by.get((ours_name[kind], 0 if kind == "plain" else k, suite))
            ours_tps = ours["tokens_per_second"]["median"] if ours else None
            results.append({"peer": kind, "k": k, "suite": suite, "tokens_per_second": tps,
                            "ours_tokens_per_second": ours_tps,
                            "ratio_ours_over_theirs": (ours_tps / tps["median"]) if ours_tps and tps["median"] else None,
                            "token_agreement": mean_over(agree[(kind, k)], prompts, suite)})
    return {"library": "transformers", "transformers": tf.__version__, "torch": torch.__version__,
            "device": device, "dtype": "float32", "torch_threads": threads_used, "ort_threads": ort_threads,
            "target_checkpoint": str(target_dir), "draft_checkpoint": str(draft_dir) if draft_dir else None,
            "throughput": "end to end (prefill included) for both sides", "results": results}
