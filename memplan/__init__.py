"""memplan: plan GPU memory for deep-neural-network training.

>>> import memplan
>>> prof = memplan.load_profile("resnet50")                              # doctest: +SKIP
>>> sched = memplan.solve(prof, algo="rotor", memory="2GB")              # doctest: +SKIP
>>> memplan.simulate(prof, sched).valid                                  # doctest: +SKIP
True

Importing memplan loads neither torch, matplotlib nor ortools.
"""

# The subpackage memplan.algorithms is imported before the function of the same name is bound:
# importing a submodule sets the attribute on its parent the first time only, so
# ``memplan.algorithms()`` stays the function after any solve (tests/test_api.py checks it).
import memplan.algorithms as _algorithms_package  # noqa: F401  (see above)
from memplan.api import algorithms, compare, simulate, solve, static_memory
from memplan.errors import InputError, InternalError, MemplanError
from memplan.profile import Profile, Stage, load_profile, save_profile
from memplan.schedule import Schedule, load_schedule
from memplan.units import parse_rate, parse_size

__version__ = "0.1.0"

__all__ = [
    "InputError",
    "InternalError",
    "MemplanError",
    "Profile",
    "Schedule",
    "Stage",
    "__version__",
    "algorithms",
    "compare",
    "load_profile",
    "load_schedule",
    "parse_rate",
    "parse_size",
    "save_profile",
    "simulate",
    "solve",
    "static_memory",
]
