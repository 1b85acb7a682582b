"""``memplan plot``: draw a schedule (memory over time, budget, operations per stream)."""

from pathlib import Path
from typing import Annotated

import typer

from memplan.cli.common import echo_err, guard
from memplan.errors import InputError


def plot(
    schedule: Annotated[
        str, typer.Argument(help="A memplan-schedule/1 file, JSON or YAML ('-': stdin).")
    ],
    profile: Annotated[
        str,
        typer.Option(
            "--profile",
            "-p",
            metavar="PROFILE",
            help="The profile the schedule was made for (file or bundled name).  [required]",
        ),
    ],
    output: Annotated[
        Path,
        typer.Option("--output", "-o", metavar="FILE", help="Figure file: .png, .svg or .pdf."),
    ],
) -> None:
    """Draw a schedule: simulated memory over time against the budget, and its operations.

    Needs the plot extra (matplotlib). Exit 0 when drawn; 1, with nothing drawn, when the
    schedule is infeasible or the simulator rejects it (as `memplan simulate` would); 2 on bad
    input.

    Example: `memplan solve resnet50 -a rotor -m 1GB -o plan.json && memplan plot plan.json -p
    resnet50 -o plan.png`
    """
    import memplan
    from memplan.cli.common import EXIT_INFEASIBLE

    with guard():
        sched = memplan.load_schedule(schedule)
        prof = memplan.load_profile(profile)
        if not sched.feasible:
            echo_err("memplan: infeasible: the schedule has no operations to draw")
            raise typer.Exit(EXIT_INFEASIBLE)
        if sched.profile.stages is not None and sched.profile.stages != prof.length:
            raise InputError(
                f"the schedule was made for {sched.profile.stages} stages, "
                f"{prof.model} has {prof.length}"
            )
        if sched.profile.sha256 and sched.profile.sha256 != prof.sha256():
            echo_err(
                f"memplan: warning: the schedule was made for a profile with sha256 "
                f"{sched.profile.sha256[:12]}..., this one has {prof.sha256()[:12]}..."
            )
        from memplan.views.plot import plot_schedule

        result = memplan.simulate(prof, sched)
        if not result.valid:  # draw only what the simulator accepts: no figure of a broken plan
            echo_err(f"memplan: invalid: {result.violation} (nothing drawn; see memplan simulate)")
            raise typer.Exit(EXIT_INFEASIBLE)
        plot_schedule(output, sched, prof, result.memory_curve)
        echo_err(f"memplan: wrote {output}")
