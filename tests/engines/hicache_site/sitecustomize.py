"""Imported at interpreter start when this directory is on PYTHONPATH (the engine tests only): installs
the stand-ins tests/engines/standins.py names, so `python -m kvevents conformance storage` runs
SGLang 0.5.20's HiRadixCache on a CPU machine. KVEVENTS_TEST_STANDINS=torchvision installs only the
torchvision stub (SGLang imports it); =hicache the three HiCache host-tier stand-ins as well.
"""

import os
import sys

_wanted = os.environ.get("KVEVENTS_TEST_STANDINS", "")
if _wanted:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import standins

    standins.stub_torchvision()
    if _wanted == "hicache":
        standins.stand_in_hicache_cpu()
