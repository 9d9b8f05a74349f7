"""docs/cli.md holds every command and option: its reference is what click's own objects generate."""

import click

from specrt.cli.main import COMMAND_MODULES, main, register_all
from specrt.cli.reference import PAGE, generated_part, reference


def all_commands(group, path="specrt"):
    register_all()
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from all_commands(cmd, f"{path} {name}")
        else:
            yield f"{path} {name}", cmd


def test_every_command_and_option_is_on_the_page():
    page = PAGE.read_text()
    missing = []
    for path, cmd in all_commands(main):
        if f"### `{path}`" not in page:
            missing.append(path)
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.hidden:
                section = page.split(f"### `{path}`", 1)[-1].split("\n### ", 1)[0]
                missing += [f"{path} {flag}" for flag in param.opts + param.secondary_opts
                            if f"`{flag}" not in section and f"/{flag}`" not in section]
    assert not missing, f"docs/cli.md lacks {missing}: run `python -m specrt.cli.reference --write`"


def test_the_page_is_what_the_commands_generate():
    assert generated_part(PAGE.read_text()) == reference(), (
        "docs/cli.md is stale: run `python -m specrt.cli.reference --write`")


def test_a_new_option_fails_the_check():
    """The drift check sees an option added to a command (on a copy of the group, not the real one)."""

    @click.group()
    def grp():
        pass

    @grp.command("generate")
    @click.option("--brand-new-flag", is_flag=True, help="new")
    def gen(brand_new_flag):
        pass

    assert "`--brand-new-flag`" in reference(grp)
    assert "`--brand-new-flag`" not in PAGE.read_text()


def test_every_command_is_found_lazily_in_its_module():
    """`specrt CMD` imports only CMD's module (COMMAND_MODULES): the map must name every command's own module."""
    register_all()
    assert sorted(main.commands) == sorted(COMMAND_MODULES)
    for name, cmd in main.commands.items():
        assert cmd.callback.__module__.endswith(f".commands.{COMMAND_MODULES[name]}"), name
