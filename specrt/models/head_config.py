"""A draft head's `head_config.json`, checked like every other bundle file (docs/safety.md §2).

The file maps the head's logit index i to the full-vocabulary token id `vocab_ids[i]`, and records the target the
head was trained for. `check_head_config` is the one validator: `specrt compile --draft head:DIR` runs it on the
head directory (specrt/models/draft_head.py, CheckpointError), `load` on the bundle's copy against the manifest's
`draft_head` entry and its target (ManifestError, through specrt/bundle/head_vocab.py's `head_vocab_ids`, which
the head's runner reads the ids through). A wrong file is refused naming the field and both values, before any request could index past
the head's logits or draft a token outside the vocabulary.
"""

from __future__ import annotations

from typing import Any, Callable

from specrt.core.errors import ManifestError
from specrt.core.jsonfile import load_json

FORMAT = "specrt-draft-head"
VERSION = 1
FUSED_VERSION = 2  # a fused head (specrt/models/draft_head_fused.py): also reads `feature_layers` of the target
TARGET_KEYS = ("architecture", "hidden_size", "vocab_size", "num_layers", "num_kv_heads", "head_dim")
STORAGES = ("float32", "float16", "int8")  # how head.safetensors holds the trained parameters (head_storage.py)


def check_head_config(cfg: Any, where: str, *, target: dict | None = None, draft_vocab_size: int | None = None,
                      error: Callable[[str], Exception] = ManifestError, versions: tuple[int, ...] = (VERSION,)
                      ) -> list[int]:
    """The head's vocabulary ids after checking `cfg` (parsed head_config.json; `where` names it): format and
    version; `vocab_ids` a non-empty list of distinct integer ids inside the target's vocabulary, as many as the
    config's own `draft_vocab_size` and the manifest's (`draft_vocab_size`); `target` (the facts of TARGET_KEYS the
    head runs on, when known) equal to the recorded ones; a fused head (version 2, where `versions` allows it) its
    `feature_layers` distinct layer indices of the target; `storage`, when present, one of STORAGES. Raises `error`
    naming the field and the values."""
    if isinstance(cfg, dict) and cfg.get("format") == FORMAT and cfg.get("version") == FUSED_VERSION:
        if FUSED_VERSION not in versions:
            raise error(f"{where}: a fused draft head (version {FUSED_VERSION}, reading the target's layers "
                        f"{_short(cfg.get('feature_layers'))}) where a plain head (version {VERSION}) is expected: "
                        "the bundle's target graphs were compiled for a plain head; recompile the bundle with it")
        _check_layers(cfg.get("feature_layers"), where, (target or {}).get("num_layers"), error)
    elif not isinstance(cfg, dict) or cfg.get("format") != FORMAT or cfg.get("version") != VERSION:
        got = (cfg.get("format"), cfg.get("version")) if isinstance(cfg, dict) else type(cfg).__name__
        raise error(f"{where}: not a {FORMAT} version {VERSION} file (found {got!r})")
    if "storage" in cfg and (not isinstance(cfg["storage"], str) or cfg["storage"] not in STORAGES):
        raise error(f"{where}: storage must be one of {', '.join(STORAGES)} (how head.safetensors holds the "
                    f"trained parameters), got {_short(cfg['storage'])}")
    ids = cfg.get("vocab_ids")
    if not isinstance(ids, list) or not ids:
        raise error(f"{where}: vocab_ids must be a non-empty list of token ids, got {_short(ids)}")
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int)]
    if bad:
        raise error(f"{where}: vocab_ids must hold integer token ids, found {_short(bad[0])}")
    for key, want in (("draft_vocab_size", cfg.get("draft_vocab_size")),
                      ("the manifest's draft_head.draft_vocab_size", draft_vocab_size)):
        if want is not None and want != len(ids):
            raise error(f"{where}: vocab_ids holds {len(ids)} ids but {key} is {_short(want)}; recompile the bundle "
                        "from the head directory")
    recorded = cfg.get("target")
    if target is not None:
        if not isinstance(recorded, dict):
            raise error(f"{where}: target must record the target the head was trained for, got {_short(recorded)}")
        for key in TARGET_KEYS:
            if key in target and recorded.get(key) != target[key]:
                raise error(f"{where}: target.{key} is {_short(recorded.get(key))} but the head runs on a target with "
                            f"{key} {_short(target[key])}: the head belongs to another model")
    vocab = (target or {}).get("vocab_size") or (recorded.get("vocab_size") if isinstance(recorded, dict) else None)
    if isinstance(vocab, int) and not isinstance(vocab, bool):
        out = next((i for i in ids if not 0 <= i < vocab), None)
        if out is not None:
            raise error(f"{where}: vocab_ids holds {out}, outside the target's {vocab}-token vocabulary")
    else:
        out = next((i for i in ids if i < 0), None)
        if out is not None:
            raise error(f"{where}: vocab_ids holds {out}, not a token id")
    if len(set(ids)) != len(ids):
        seen: set[int] = set()
        twice = next(i for i in ids if i in seen or seen.add(i))
        raise error(f"{where}: vocab_ids holds {twice} twice (each logit must name a distinct token)")
    return ids


def _check_layers(layers: Any, where: str, num_layers: int | None, error: Callable[[str], Exception]) -> None:
    ok = isinstance(layers, list) and layers and all(isinstance(i, int) and not isinstance(i, bool) for i in layers)
    if not ok or len(set(layers)) != len(layers):
        raise error(f"{where}: feature_layers must be a list of distinct layer indices, got {_short(layers)}")
    bad = next((i for i in layers if i < 0 or (num_layers is not None and i >= num_layers)), None)
    if bad is not None:
        raise error(f"{where}: feature_layers holds {bad}, outside the target's {num_layers} layers")


def target_facts(config: Any) -> dict[str, Any]:
    """TARGET_KEYS of a decoder config (the target a head runs on)."""
    return {key: getattr(config, key) for key in TARGET_KEYS}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
