"""Profiles: the data model (``memplan-profile/1``) and its I/O."""

from memplan.files import write_atomic
from memplan.profile.io import bundled_profiles, load_profile, save_profile
from memplan.profile.model import PROFILE_FORMAT, Device, Measured, Profile, Stage

__all__ = [
    "PROFILE_FORMAT",
    "Device",
    "Measured",
    "Profile",
    "Stage",
    "bundled_profiles",
    "load_profile",
    "save_profile",
    "write_atomic",
]
