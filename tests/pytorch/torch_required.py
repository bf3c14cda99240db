"""What every test here starts with: the project's pytorch/ on the import
path, and a skip (exit code 77, which ctest reports as skipped) saying why
when this python3 has no torch. `import torch_required` before importing
torch or anything from pytorch/; `torch_required.ROOT` is the checkout."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "pytorch"))
try:
    import torch  # noqa: F401
except ImportError:
    print("skipped: this python3 (%s) cannot import torch: scripts/install-deps makes .venv/ "
          "with the pinned stack's" % sys.executable)
    sys.exit(77)
