"""What the benchmark scripts share."""

from __future__ import annotations

import os
import platform


def machine() -> str:
    """The CPU model, core count and Python version, printed at the head of every benchmark."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"
