"""The CUDA tests run only through `hatch run test-gpu:run` (tools/test_gpu.py), which
first says plainly whether a CUDA device is here; the CPU cells never collect them."""

import os

collect_ignore_glob = [] if os.environ.get("DT_TEST_GPU") == "1" else ["test_*.py"]
