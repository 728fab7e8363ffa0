"""On this directory's PYTHONPATH, every Python process starts holding PTENV_HOLD_FDS open file
descriptors, so that each fd it opens afterwards (a sandbox's channel among them) is numbered past
them: vf-eval and the env-server workers it spawns alike (tests/test_scale.py)."""

import os
import resource

_count = int(os.environ.get("PTENV_HOLD_FDS", "0"))
if _count:
    _soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(_soft, min(_hard, _count + 1024)), _hard))
    HELD = [os.open("/dev/null", os.O_RDONLY) for _ in range(_count)]
