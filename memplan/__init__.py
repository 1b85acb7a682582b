"""memplan: plan GPU memory for deep-neural-network training.

>>> import memplan
>>> prof = memplan.load_profile("resnet50")                              # doctest: +SKIP
>>> sched = memplan.solve(prof, algo="rotor", memory="2GB")              # doctest: +SKIP
>>> memplan.simulate(prof, sched).valid                                  # doctest: +SKIP
True

Importing memplan loads neither torch, matplotlib nor ortools.
"""

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
