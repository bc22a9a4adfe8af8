"""`radixflow` command line: each subcommand lives in radixflow.commands.<name>."""

from __future__ import annotations

import argparse
import importlib
import sys

from radixflow.commands.flags import remember_defaults

# name -> module; each module has add_arguments(parser) and run(args) -> int
COMMANDS = {
    "simulate": ("radixflow.commands.simulate", "run the scheduler arms on the cost-model simulator"),
    "bench": ("radixflow.commands.bench", "run the arms on the real PyTorch engine"),
    "serve": ("radixflow.commands.serve", "OpenAI-compatible HTTP server"),
    "experiment": ("radixflow.commands.experiment", "paper-scale simulator experiments"),
    "report": ("radixflow.commands.report", "tables and figures from experiment results"),
    "trace": ("radixflow.commands.trace", "per-turn cache traces (multi-turn chat)"),
}


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """Prints a bad flag as one line (`radixflow bench: error: argument --dtype: ...`), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def make_parser(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, dict]:
    """The full parser and the command modules loaded: only the chosen command's (the simulator must
    not pay for torch), all of them when `argv` names none (--help, or None: every command)."""
    parser = Parser(prog="radixflow", description="Hybrid prefix caching that fills every round.")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    chosen = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    wanted = [chosen] if chosen in COMMANDS else list(COMMANDS)
    for name, (modname, help_text) in COMMANDS.items():
        if name not in wanted:
            sub.add_parser(name, help=help_text)
            continue
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name == modname:
                continue  # command not built in this checkout
            raise
        modules[name] = mod
        p = sub.add_parser(name, help=help_text, description=(mod.__doc__ or help_text).strip().splitlines()[0])
        mod.add_arguments(p)
        remember_defaults(p)  # after every flag: what the user set can be told from a default (commands/flags.py)
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser, modules = make_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a bad flag (2) or --help (0): the exit code, returned as run's would be
        return e.code if isinstance(e.code, int) else int(e.code is not None)
    try:
        return int(modules[args.command].run(args) or 0)
    except (CliError, ValueError, FileNotFoundError, MemoryError) as e:
        print(f"radixflow {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
