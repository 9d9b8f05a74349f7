"""Chat templates render under a time and size bound (a template is code from the checkpoint)."""

from __future__ import annotations

import time

import pytest

from specrt.core.errors import InvalidArgument
from specrt.runtime.chat_template import ChatFormatter
from specrt.runtime.template_bounds import RenderBounds, TemplateBoundExceeded

MSGS = [{"role": "user", "content": "hi"}]
HOSTILE = {
    "nested loop": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x",
    "filter loop": "{% for i in range(100000) %}{{ range(100000)|map('string')|join('-') }}{% endfor %}",
    "repetition": "{{ 'x' * 10**9 }}",
    "big power": "{{ 7 ** 100000000 }}",
    "wide filter": "{{ 'x'|center(1000000000) }}",
    "percent width": "{{ '%1000000000s' % 'x' }}",
    "format width": "{{ '{:>1000000000}'.format('x') }}",
    "doubling ~": "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
                  "{% endfor %}{{ ns.s|length }}",
    "doubling +": "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
                  "{% endfor %}{{ ns.s|length }}",
    "long output": "{% for i in range(100000) %}{{ 'abcdefghij' * 99 }}{% endfor %}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_is_refused_quickly(name):
    fmt = ChatFormatter(HOSTILE[name], bounds=RenderBounds(max_seconds=0.5))
    t0 = time.perf_counter()
    with pytest.raises(TemplateBoundExceeded) as err:
        fmt.render(MSGS)
    assert time.perf_counter() - t0 < 5.0  # the bound (0.5 s) plus one filter pass at most, on a loaded machine
    assert isinstance(err.value, InvalidArgument) and "chat template" in str(err.value)


def test_formatter_still_usable_after_a_hit_bound():
    fmt = ChatFormatter("{% if messages|length > 1 %}{% for i in range(100000) %}{% for j in range(100000) %}"
                        "{% endfor %}{% endfor %}{% endif %}<{{ messages[-1]['content'] }}>",
                        bounds=RenderBounds(max_seconds=0.3))
    with pytest.raises(TemplateBoundExceeded):
        fmt.render(MSGS * 2)
    assert fmt.render(MSGS) == ("<hi>", False)


def test_ordinary_templates_render_as_before():
    chatml = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
              "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
              "{% endif %}")
    text, add = ChatFormatter(chatml).render([{"role": "system", "content": "be brief"}] + MSGS)
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert add is False
    # moderate sizes and numbers stay allowed
    assert ChatFormatter("{{ '-' * 80 }}{{ 2 ** 20 }}{{ 'x'|center(9) }}{{ '%5s' % 'a' }}").render(MSGS)[0] == \
        "-" * 80 + "1048576" + "    x    " + "    a"


def test_bounds_are_validated():
    with pytest.raises(ValueError, match="max_seconds"):
        RenderBounds(max_seconds=0)
    with pytest.raises(ValueError, match="max_chars"):
        RenderBounds(max_chars=10)


def test_a_template_rendering_a_lone_surrogate_is_one_clear_error():
    """A chat_template from JSON may hold "\\ud800": the rendered text then reached `tokenizers`, a TypeError."""
    fmt = ChatFormatter("{% for m in messages %}{{ m.content }}{% endfor %}\ud800")
    with pytest.raises(InvalidArgument, match=r"chat template rendered a lone surrogate \(U\+D800 at character 2\)"):
        fmt.render(MSGS)
    with pytest.raises(InvalidArgument, match="message 1's content holds a lone surrogate"):
        ChatFormatter("{{ messages[0].content }}").render([MSGS[0], {"role": "user", "content": "a\udcffb"}])


@pytest.mark.parametrize("template, error", [("{{ messages + 1 }}", "TypeError: can only concatenate list"),
                                             ("{{ 1 // 0 }}", "ZeroDivisionError: integer division")])
def test_a_template_failing_in_python_is_one_clear_error(template, error):
    """A checkpoint's template whose expression fails in Python was the bare exception (`TypeError: can only
    concatenate list ...`, exit 1) from compile's successor-table prompts and `generate --chat`."""
    with pytest.raises(InvalidArgument, match=f"the model's chat template failed on the messages: {error}"):
        ChatFormatter(template).render(MSGS)


def test_the_tokenizer_refuses_a_lone_surrogate_in_one_line(tokenizer_path):
    from specrt.core.tokenizer import Tokenizer

    tok = Tokenizer(tokenizer_path)
    with pytest.raises(InvalidArgument, match=r"lone surrogate \(U\+DCFF at character 3\)"):
        tok.encode("def\udcff")
    assert tok.encode("def")  # valid text unaffected


TRANSFORMERS_LIKE = [  # the constructs real checkpoints' templates use, rendered as transformers renders them
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<|a|>{% endif %}",
    "{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}{% for m in messages %}{{ m | tojson }}{% endfor %}",
    "{% if tools %}{% for t in tools %}{{ t.function | tojson(separators=(',', ':'), sort_keys=True) }}\n"
    "{% endfor %}{% endif %}{% for m in messages %}{{ m.content | tojson(ensure_ascii=True) }}{% endfor %}",
    "{{ bos_token }}{% for m in messages %}{% if loop.index0 == 2 %}{% break %}{% endif %}{{ m['content'] | trim }}"
    "{{ eos_token }}{% endfor %}",
    "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{{ eos_token }}"
    "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}",  # transformers' training-mask tag
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Wetter für eine Stadt",
                                          "parameters": {"type": "object", "required": ["city"],
                                                         "properties": {"city": {"type": "string"}}}}}]
MESSAGES = [{"role": "system", "content": "Sei kurz."}, {"role": "user", "content": " Wie ist das Wetter in Köln? "},
            {"role": "assistant", "content": "Sonnig."}]


@pytest.mark.parametrize("template", TRANSFORMERS_LIKE)
def test_templates_render_as_transformers_renders_them(template, tokenizer_path):
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_path), bos_token="<s>", eos_token="</s>")
    want = hf.apply_chat_template(MESSAGES, tools=TOOLS, chat_template=template, tokenize=False,
                                  add_generation_prompt=True)
    text, _ = ChatFormatter(template, "<s>", "</s>").render(MESSAGES, tools=TOOLS)
    assert text == want


def bundle_with_tokenizer_config(tmp_path, pair_bundle, cfg: dict):
    """A copy of the pair bundle whose manifest lists `cfg` as its tokenizer_config.json and chat template file."""
    import hashlib
    import json
    import shutil

    from specrt.bundle.manifest import read_manifest

    bundle = shutil.copytree(pair_bundle, tmp_path / "b")
    f = bundle / "tokenizer" / "tokenizer_config.json"
    f.write_text(json.dumps(cfg))
    m = json.loads((bundle / "manifest.json").read_text())
    m["tokenizer"].update(config="tokenizer/tokenizer_config.json", chat_template="tokenizer/tokenizer_config.json")
    m["files"]["tokenizer/tokenizer_config.json"] = {"sha256": hashlib.sha256(f.read_bytes()).hexdigest(),
                                                     "size": f.stat().st_size}
    (bundle / "manifest.json").write_text(json.dumps(m))
    return read_manifest(bundle)


def test_a_template_file_without_a_template_is_refused_not_replaced(tmp_path, pair_bundle):
    """`chat_template: 5` (compiled before compile checked it): `generate --chat` and the server used the plain format
    while `inspect` named the file as the bundle's template; now one BundleError naming the file."""
    from specrt.core.errors import BundleError

    with pytest.raises(BundleError, match=r"chat template file tokenizer/tokenizer_config\.json holds no template "
                                          r"\(chat_template is 5\)"):
        ChatFormatter.from_manifest(bundle_with_tokenizer_config(tmp_path, pair_bundle, {"chat_template": 5}))


def test_named_templates_as_a_mapping_render(tmp_path, pair_bundle):
    """transformers also keeps named templates as {name: template}: the default one renders, `tool_use` serves tools."""
    manifest = bundle_with_tokenizer_config(tmp_path, pair_bundle, {"chat_template": {
        "default": "D:{{ messages[0].content }}", "tool_use": "T:{{ messages[0].content }}"}})
    fmt = ChatFormatter.from_manifest(manifest)
    assert fmt.render(MSGS)[0] == "D:hi" and fmt.with_tools().render(MSGS)[0] == "T:hi"
