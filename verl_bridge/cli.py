"""The ``verl-bridge`` command line.

Subcommands are imported lazily (click's LazyGroup pattern) so that ``verl-bridge --help``
imports neither torch nor megatron and answers in well under a second.

Exit codes everywhere: 0 success / nothing to do, 1 the command ran and found problems,
2 usage error or internal error.
"""

from __future__ import annotations

import importlib
import sys

import click

# name -> ("module:attribute", one-line help). Help text lives here so --help needs no import.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("verl_bridge.commands.train:train", "Run PPO/GRPO training from a YAML config."),
    "migrate": ("verl_bridge.migrate.command:migrate", "Rewrite a hand-written PPO/GRPO loop into MegatronTrainer."),
    "doctor": ("verl_bridge.doctor.command:doctor", "Diagnose ImportErrors and version clashes."),
    "init": ("verl_bridge.commands.init:init", "Write a starter config from a shipped template."),
    "convert": ("verl_bridge.commands.convert:convert", "Convert checkpoints between Hugging Face and Megatron layouts."),
    "plot": ("verl_bridge.commands.plot:plot", "Plot reward, KL, losses and throughput of a run."),
    "validate": ("verl_bridge.commands.validate:validate", "Validate a config without running it."),
    "plan": ("verl_bridge.commands.plan:plan", "Estimate per-rank memory and weight-sync cost of a config."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        target, _ = SUBCOMMANDS[name]
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # a missing optional piece must not crash --help of others
            raise click.ClickException(
                f"the '{name}' command could not be loaded: {exc}. "
                "Run `verl-bridge doctor` to see what is missing."
            ) from None
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SUBCOMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="verl-bridge", prog_name="verl-bridge")
def cli() -> None:
    """verl-bridge: RL post-training for Megatron-LM / megatron-core models.

    \b
    Quickstart (CPU, built-in tiny model):
      verl-bridge train templates/quickstart.yaml
    """


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point. Maps click's exceptions onto the exit-code contract."""
    try:
        rv = cli.main(args=argv, prog_name="verl-bridge", standalone_mode=False)
    except click.exceptions.UsageError as exc:
        exc.show()
        return 2
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 2
    except click.exceptions.Exit as exc:
        return exc.exit_code
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
