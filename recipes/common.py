"""Shared training utilities: device/precision selection, batch sampling, LR
schedule, resumable checkpoints and a generic time-budgeted training loop."""
from __future__ import annotations

import contextlib
import math
import os
import pickle
import random
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch


def pick_device() -> torch.device:
    """CUDA if available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast(device: torch.device):
    """bf16 autocast on CPU (fast with avx512_bf16/AMX) and CUDA; weights stay fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16)


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def sample_batch(tokens: np.ndarray, batch_size: int, length: int, step: int, seed: int,
                 device: torch.device) -> torch.Tensor:
    """Random windows of ``length`` tokens; deterministic in (seed, step) so that a
    resumed run sees exactly the batches it would have seen."""
    g = np.random.default_rng([seed, step])
    starts = g.integers(0, len(tokens) - length, size=batch_size)
    batch = np.stack([tokens[s:s + length] for s in starts]).astype(np.int64)
    return torch.from_numpy(batch).to(device)


def cosine_lr(step: int, total: int, peak: float, warmup: int, floor: float = 0.1,
              time_frac: float = 0.0) -> float:
    """Linear warmup then cosine decay to ``floor * peak``.  The decay follows the
    larger of the step fraction and ``time_frac`` (fraction of the time budget used)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, max(time_frac, (step - warmup) / max(1, total - warmup)))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def _numpy_state_to_plain(state: tuple) -> tuple:
    """numpy's legacy RNG state with its key array as a tensor (loadable with weights_only=True)."""
    name, keys, pos, has_gauss, cached = state
    return name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)


def _numpy_state_from_plain(state: tuple) -> tuple:
    name, keys, pos, has_gauss, cached = state
    return name, keys.numpy().astype(np.uint32), pos, has_gauss, cached


def save_checkpoint(path: Path, module: torch.nn.Module, opt: torch.optim.Optimizer,
                    step: int, extra: dict) -> None:
    """Atomically save trainable state, optimizer, step and RNG states."""
    state = {
        "model": {k: v for k, v in module.state_dict().items()},
        "optimizer": opt.state_dict(),
        "step": step,
        "extra": extra,
        "rng": {"torch": torch.get_rng_state(), "numpy": _numpy_state_to_plain(np.random.get_state()),
                "python": random.getstate()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, module: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[int, dict]:
    """Restore a checkpoint written by :func:`save_checkpoint`; returns (step, extra)."""
    # weights_only: a resume file is data; unpickling arbitrary objects would run a planted file's code
    from specrt.core.errors import CheckpointError

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"resume file {path} holds more than tensors and plain values (written by an older "
                         "version, or planted): refusing to unpickle it; delete it to start over") from None
    except (RuntimeError, EOFError, OSError, ValueError, MemoryError) as exc:  # truncated or not a torch file
        raise CheckpointError(f"resume file {path} is truncated or corrupt ({type(exc).__name__}): delete it to "
                              "start over") from None
    try:
        module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(_numpy_state_from_plain(state["rng"]["numpy"]))
        random.setstate(state["rng"]["python"])
        step, extra = int(state["step"]), dict(state["extra"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:  # another run's or an edited file
        raise CheckpointError(f"resume file {path} does not fit this run ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}): delete it to start over") from None
    return step, extra


def train_loop(module: torch.nn.Module, params: list, loss_fn: Callable[[int], torch.Tensor], *,
               ckpt_path: Path, steps: int | None, tokens_per_step: int, lr: float,
               warmup: int = 50, weight_decay: float = 0.1, max_minutes: float | None = None,
               ckpt_minutes: float = 3.0, progress: bool = True, desc: str = "train",
               calibrate_steps: int = 4) -> dict:
    """Run AdamW on ``params`` minimising ``loss_fn(step)``, resumably.

    ``module`` holds the trainable state saved in checkpoints.  If ``steps`` is None
    the total is chosen from measured throughput so that training fills
    ``max_minutes`` (the choice is stored in the checkpoint so resumes keep the
    same schedule); ``steps`` given on a resume is the new total (steps already done count).  With ``max_minutes`` the LR schedule also follows the
    fraction of the time budget spent (accumulated over resumes), and training ends
    when the budget is spent, so a slowed-down machine (shared CPU) still gets a
    fully decayed schedule, just with fewer steps.
    """
    t_start = time.time()  # before the optimizer: its first construction imports torch's compiler (seconds)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    step, extra = 0, {"total_steps": steps, "wall_s": 0.0, "losses": []}
    if ckpt_path.exists():
        step, extra = load_checkpoint(ckpt_path, module, opt)
        if steps is not None and steps != extra.get("total_steps"):  # the steps asked now win over the saved run's
            extra["total_steps"] = steps
        print(f"[{desc}] resumed from {ckpt_path} at step {step}"
              + (f" (training to step {steps})" if steps is not None else ""), flush=True)
    last_ckpt = t_start
    wall_prev = extra["wall_s"]
    budget_s = extra.setdefault("budget_s", max_minutes * 60 if max_minutes else None)

    def time_frac() -> float:
        return (wall_prev + time.time() - t_start) / budget_s if budget_s else 0.0

    def one_step(s: int, total: int) -> float:
        for g in opt.param_groups:
            g["lr"] = cosine_lr(s, total, lr, warmup, time_frac=time_frac() if total < 10**9 else 0.0)
        loss = loss_fn(s)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return float(loss.detach())

    if extra["total_steps"] is None:
        if max_minutes is None:
            raise ValueError("give steps or max_minutes")
        # Calibrate: time a few real (warmup-phase) steps, then size the run.
        one_step(step, 10**9); step += 1  # first step includes one-off overheads
        t0 = time.time()
        for _ in range(calibrate_steps):
            extra["losses"].append(one_step(step, 10**9)); step += 1
        sec = (time.time() - t0) / calibrate_steps
        remaining = max_minutes * 60 - (time.time() - t_start)
        extra["total_steps"] = step + max(1, int(remaining * 0.97 / sec))
        extra["calibrated_tokens_per_s"] = tokens_per_step / sec
        print(f"[{desc}] {tokens_per_step / sec:.0f} tokens/s -> {extra['total_steps']} steps", flush=True)
    total = extra["total_steps"]

    tty = progress and sys.stdout.isatty()
    ctx = contextlib.nullcontext()
    bar = None
    if tty:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)
        bar = Progress(TextColumn(f"[bold]{desc}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn(),
                       TimeRemainingColumn())
        ctx = bar
    with ctx:
        task = bar.add_task(desc, total=total, completed=step, loss=float("nan")) if bar else None
        ema = None
        while step < total and time_frac() < 1.0:
            loss = one_step(step, total)
            ema = loss if ema is None else 0.95 * ema + 0.05 * loss
            step += 1
            if step % 10 == 0:
                extra["losses"].append(round(ema, 4))
            if bar:
                bar.update(task, completed=step, loss=ema)
            elif progress and (step % 25 == 0 or step == total):
                el = time.time() - t_start
                print(f"[{desc}] step {step}/{total} loss {ema:.4f} elapsed {el:.0f}s", flush=True)
            if time.time() - last_ckpt > ckpt_minutes * 60:
                extra["wall_s"] = wall_prev + time.time() - t_start
                save_checkpoint(ckpt_path, module, opt, step, extra)
                last_ckpt = time.time()
    extra["wall_s"] = wall_prev + time.time() - t_start
    save_checkpoint(ckpt_path, module, opt, step, extra)
    return {"steps_done": step, "total_steps": total, "completed": step >= total or time_frac() >= 1.0,
            "tokens_seen": step * tokens_per_step, "wall_s": extra["wall_s"],
            "final_loss": ema if step else None, "loss_curve": extra["losses"],
            "calibrated_tokens_per_s": extra.get("calibrated_tokens_per_s")}
