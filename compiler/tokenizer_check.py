"""Draft and target must tokenize identically: compare their `tokenizer.json` vocabularies."""

from __future__ import annotations

from pathlib import Path

from specrt.core.errors import CheckpointError


def load_vocab(path: Path) -> dict[str, int]:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
    except Exception as exc:
        raise CheckpointError(f"cannot read tokenizer {path}: {exc}") from None


def check_same_vocab(target_tok: Path, draft_tok: Path) -> int:
    """Raise CheckpointError if the vocabularies differ; return the vocabulary size."""
    t, d = load_vocab(target_tok), load_vocab(draft_tok)
    if t != d:
        only_t = len(set(t.items()) - set(d.items()))
        only_d = len(set(d.items()) - set(t.items()))
        raise CheckpointError(
            f"draft and target vocabularies differ (target {len(t)} tokens, draft {len(d)} tokens; "
            f"{only_t} entries only in the target, {only_d} only in the draft): the draft must use the "
            "target's tokenizer"
        )
    return len(t)


def check_fits_model(tokenizer: Path, model_vocab: int, role: str) -> None:
    """The tokenizer's own vocabulary (added tokens aside) must fit the model's embedding rows: a tokenizer of
    another model would feed the graph ids past them (an error at the first prompt, or wrong text)."""
    from tokenizers import Tokenizer

    try:
        ids = Tokenizer.from_file(str(tokenizer)).get_vocab(with_added_tokens=False).values()
    except Exception as exc:
        raise CheckpointError(f"cannot read tokenizer {tokenizer}: {exc}") from None
    end = max(ids, default=-1) + 1
    if end > model_vocab:
        raise CheckpointError(f"{tokenizer} holds token ids up to {end - 1}, but the {role}'s config.json has "
                              f"vocab_size {model_vocab}: the tokenizer is not this model's")


def check_chat_template(checkpoint: Path) -> None:
    """The checkpoint's chat template, copied into the bundle, must be one the runtime can read: tokenizer_config.json
    a JSON object whose `chat_template` is text or a list of {"name", "template"} (transformers' named templates),
    chat_template.jinja UTF-8 text. Checked before export, so a bad file costs no compile."""
    from specrt.models.config_files import read_json

    cfg = checkpoint / "tokenizer_config.json"
    if cfg.exists():
        template = read_json(cfg).get("chat_template")
        named = (isinstance(template, list) and all(
            isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
            for t in template)) or (isinstance(template, dict) and all(isinstance(t, str) for t in template.values()))
        if template is not None and not isinstance(template, str) and not named:
            raise CheckpointError(f"{cfg}: chat_template must be a Jinja template (a string) or a list of "
                                  f"{{\"name\", \"template\"}} objects, got {json_excerpt(template)}")
    jinja = checkpoint / "chat_template.jinja"
    if jinja.exists():
        from specrt.core.errors import InvalidArgument
        from specrt.core.jsonfile import JSON_MAX_BYTES
        from specrt.core.textfile import read_user_text

        try:
            read_user_text(jinja, "chat template", JSON_MAX_BYTES)
        except InvalidArgument as exc:
            raise CheckpointError(str(exc)) from None


def json_excerpt(value: object, limit: int = 60) -> str:
    import json

    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."
