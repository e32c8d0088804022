"""``pamsim <command> --help`` tells the truth (issue 30): every option says what it does,
and the default it states, typed on the command line, gives the value the command uses
when the option is left out; ``pamsim --version``."""
import re
from importlib.metadata import version

import pytest

from sim.cli import DefaultsFormatter, build_parser, main

PARSER = build_parser()
COMMANDS = next(a for a in PARSER._actions if a.dest == "command").choices
#: what a command needs on its command line besides the option under test
REQUIRED = {"study": ["table3"], "verilog": ["--unit", "mul"]}
OPTIONS = [(name, a) for name, cmd in COMMANDS.items() for a in cmd._actions
           if a.option_strings and a.dest != "help"]


@pytest.mark.parametrize("name,action", OPTIONS,
                         ids=[f"{n} {a.option_strings[-1]}" for n, a in OPTIONS])
def test_help_states_the_real_default(name, action):
    cmd = COMMANDS[name]
    assert action.help, f"pamsim {name} {action.option_strings[-1]} has no help"
    text = DefaultsFormatter(cmd.prog)._get_help_string(action)
    stated = re.fullmatch(r".*\(default: (.*)\)", text, re.S)
    if stated is None:          # a flag, or a default the help text explains
        assert action.default in (None, False, ""), text
        return
    stated = stated.group(1)
    # the help states its default once, and only in the form the test reads
    assert "default" not in action.help.lower(), text
    assert f"(default: {stated})" in " ".join(cmd.format_help().split())
    left_out = getattr(cmd.parse_args(REQUIRED.get(name, [])), action.dest)
    if stated == "none":
        assert left_out is not None and len(left_out) == 0
        return
    typed = stated.split(" ") if action.nargs in ("+", "*") else [stated]
    given = cmd.parse_args([*REQUIRED.get(name, []), action.option_strings[-1], *typed])
    assert getattr(given, action.dest) == left_out


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"pamsim {version('pamsim')}"
