"""What the commands that read a profile share (``solve``, ``compare``, ``info``, ``show``): their
PROFILE argument and options, declared once as ``Annotated`` aliases.

The help texts are those of ``memplan solve`` (:mod:`memplan.cli.solve`), whose signature still
spells its own declarations out; the commands that build a model share theirs in
:mod:`memplan.cli.model_options`.
"""

from pathlib import Path
from typing import Annotated

import typer

from memplan.cli.solve import (
    GRADIENTS_HELP,
    GRADIENTS_METAVAR,
    OPTIMIZER_HELP,
    OPTIMIZER_METAVAR,
    OUTPUT_HELP,
    PROFILE_HELP,
)

ProfileArgument = Annotated[
    str | None, typer.Argument(metavar="PROFILE", help=PROFILE_HELP, show_default=False)
]
"""PROFILE: a file, '-' or a bundled name; left out, read from a pipe."""
OptimizerOption = Annotated[str, typer.Option(metavar=OPTIMIZER_METAVAR, help=OPTIMIZER_HELP)]
"""``--optimizer``: the optimizer counted in the budget."""
GradientsOption = Annotated[str, typer.Option(metavar=GRADIENTS_METAVAR, help=GRADIENTS_HELP)]
"""``--gradients``: the training loop a plan is made for."""
DocumentOutputOption = Annotated[
    Path | None, typer.Option("--output", "-o", metavar="FILE", help=OUTPUT_HELP)
]
"""``--output``: the document to a file instead of stdout (its format from the suffix)."""
