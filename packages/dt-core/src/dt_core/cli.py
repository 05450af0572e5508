"""`dt-plugins`: list the installed plugins (why any is inactive, their settings), check
that they can all work together and that what they contribute fits how torch will call
it, or run a command and show what the plugins counted while it ran."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .kit.report import text_table
from .records import PluginInfo

if TYPE_CHECKING:
    from .inactive import Inactive


def _why(info: PluginInfo) -> Inactive | None:
    from dt_core import activation

    from .inactive import why_inactive

    return why_inactive(info, activation.is_active())


def _format_list(infos: list[PluginInfo], verbose: bool = False) -> str:
    """One row per plugin, by name, and a line per inactive plugin saying why and how to
    turn it on; `verbose` adds a line per op, pass and patch each plugin installs."""
    if not infos:
        return "no dt plugins installed (entry-point group 'dt.plugins')"
    from .hookspecs import HOOK_API_VERSION

    infos = sorted(infos, key=lambda info: info.name)

    header = ["plugin", "distribution", "version", "hook API", "state", "why inactive"]
    rows = [[*header, "ops", "passes", "patches"]]
    whys = {info.name: _why(info) for info in infos}
    for info in infos:
        why = whys[info.name]
        rows.append(
            [
                info.name,
                info.distribution or "(in-process)",
                info.version or "-",
                info.api or "-",
                info.state,
                why.label if why else "-",
                str(len(info.ops)),
                str(len(info.passes)),
                str(len(info.patches)),
            ]
        )
    out = [text_table(rows), f"(this dt-core provides hook API {HOOK_API_VERSION})"]
    for info in infos:
        why = whys[info.name]
        if why is not None:
            out.append(f"{info.name}: {info.state}: {why.sentence()}")
    if not verbose:
        out.append("(dt-plugins list --verbose: every op, pass and patch of each plugin)")
        return "\n".join(out)
    for info in infos:
        for op in info.ops:
            out.append(f"{info.name}: op {op}")
        for label, names in (("pass", info.passes), ("", info.patches)):
            for name in names:
                detail = json.dumps(info.details.get(name, {}), sort_keys=True, default=repr)
                out.append(f"{info.name}: {label + ' ' if label else ''}{name} {detail}")
    return "\n".join(out)


def _as_dict(info: PluginInfo) -> dict[str, object]:
    why = _why(info)
    return {**info.as_dict(), "inactive": None if why is None else dataclasses.asdict(why)}


def _list(args: argparse.Namespace) -> int:
    import dt_core

    infos = dt_core.plugins()
    if args.json:
        print(json.dumps([_as_dict(info) for info in infos], indent=2, default=repr))
    else:
        print(_format_list(infos, verbose=args.verbose))
    if args.settings:
        from dt_core.kit.report import settings_table

        print()
        print(settings_table())
    return 0


def check_problems(infos: list[PluginInfo]) -> list[str]:
    """Everything that stops the installed plugins (`infos`) from working, as lines.

    An untested torch the user opted into (the override) is no problem: the plugins run;
    nor is a plugin inactive by the user's request (autoload off, disabled by name).
    """
    from dt_core import activation
    from dt_core.compat.torch_version import torch_version_problem, untested_torch_allowed

    problems = []
    version_problem = None if untested_torch_allowed() else torch_version_problem()
    if version_problem:
        problems.append(version_problem)
    for info in infos:
        if info.state == "failed" and not (version_problem and info.reason == version_problem):
            problems.append(f"plugin {info.name!r} failed: {info.reason}")
        if info.state == "incompatible":
            problems.append(f"plugin {info.name!r} is incompatible: {info.reason}")
        why = _why(info)
        if info.state in ("inactive", "pending") and why is not None and not why.requested:
            problems.append(f"plugin {info.name!r} is inactive: {why.sentence()}")
    for claim, first, second in activation.conflicts():
        problems.append(f"conflict: plugins {first!r} and {second!r} both claim {claim}")
    return problems


def _install_for_check() -> tuple[list[str], int]:
    """Install the plugins in this process as a user's first DTensor use would (arming
    them first if autoload is off by request). Returns notes on what the user turned
    off, and how many plugins that leaves inactive."""
    import dt_core
    from dt_core import activation

    from .inactive import autoload_off

    notes, requested = [], 0
    for info in dt_core.plugins():
        why = _why(info)
        requested += bool(why and why.requested)
        if info.state == "disabled" and why is not None:
            notes.append(f"plugin {info.name!r} is inactive by request: {why.sentence()}")
    off = None if activation.is_active() else autoload_off()
    if off is not None:
        notes.append(
            f"the plugins are inactive by request: {off.sentence()}; "
            "checked as dt_core.activate() would install them"
        )
        activation.arm()
    if activation.is_active():
        import torch.distributed.tensor  # noqa: F401 - installs the DTensor part

    return notes, requested


def _check(args: argparse.Namespace) -> int:
    import dt_core
    from dt_core import activation

    from .contribution_checks import checked_counts, contribution_problems

    notes, requested = _install_for_check()
    infos = dt_core.plugins()
    problems = check_problems(infos)
    checked: dict[str, int] = {}
    if activation.is_active():  # what is installed: nothing to validate otherwise
        usable = activation.ACTIVATION.registry.usable()
        problems += contribution_problems(usable)
        checked = checked_counts(usable)
    for line in notes:
        print(f"note: {line}")
    what = ", ".join(f"{n} {kind}" for kind, n in checked.items()) or "none (nothing installed)"
    print(
        f"checked: {len(infos)} plugin(s) found and their states, the torch release, each "
        f"hook API range, and what the active plugins contribute: {what}"
    )
    count = len(infos)
    by_request = f", {requested} inactive by request" if requested else ""
    if problems:
        for line in problems:
            print(f"problem: {line}")
        print(f"dt-plugins check: {len(problems)} problem(s) among {count} plugin(s)")
        return 1
    from dt_core.compat.torch_version import (
        ALLOW_UNTESTED_ENV,
        TESTED_TORCH_SPEC,
        torch_version,
        torch_version_problem,
    )

    if torch_version_problem():
        print(
            f"note: torch {torch_version()} is outside the tested releases "
            f"({TESTED_TORCH_SPEC}); the plugins run because {ALLOW_UNTESTED_ENV}=1"
        )
        print(
            f"dt-plugins check: ok ({count} plugin(s){by_request}, on an untested torch by request)"
        )
        return 0
    print(f"dt-plugins check: ok ({count} plugin(s){by_request}, torch in the tested range)")
    return 0


def _stats(args: argparse.Namespace) -> int:
    from dt_core.kit.report import run_with_stats, stats_table

    command = [c for c in args.cmd if c != "--"] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        print("dt-plugins stats: give a command to run, e.g. dt-plugins stats -- python train.py")
        return 2
    code, totals, processes = run_with_stats(command)
    print(stats_table(totals, processes))
    return code


def build_parser() -> argparse.ArgumentParser:
    """The command line, on its own: the documentation renders its reference from it."""
    parser = argparse.ArgumentParser(prog="dt-plugins", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    list_parser = commands.add_parser("list", help="table of the installed plugins")
    list_parser.add_argument("--json", action="store_true", help="machine-readable output")
    list_parser.add_argument(
        "--settings", action="store_true", help="also every plugin setting and its variable"
    )
    list_parser.add_argument(
        "--verbose", action="store_true", help="also every op, pass and patch of each plugin"
    )
    list_parser.set_defaults(run=_list)
    stats_parser = commands.add_parser(
        "stats", help="run a command, then show the plugins' counters summed over its processes"
    )
    stats_parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command [args...]")
    stats_parser.set_defaults(run=_stats)
    check_parser = commands.add_parser(
        "check",
        help="install the plugins here and validate what they contribute; exit non-zero "
        "when something is wrong",
    )
    check_parser.set_defaults(run=_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import warnings

    # Failures are reported by the command itself; the import-time warnings repeat them.
    warnings.filterwarnings("ignore", message="dt-core:", category=RuntimeWarning)
    if args.command != "stats":  # stats only runs a command: no need for torch here
        import torch  # noqa: F401 - show plugins as a user's `import torch` leaves them

    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
