"""Suite-wide test set-up.

Every test process runs with the Ascend platform on the CPU reference device
(``VLLM_ASCEND_DEVICE=cpu``), set before anything resolves vLLM's current platform; tests
that need another platform start a subprocess with their own environment.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("VLLM_ASCEND_DEVICE", "cpu")
sys.path.insert(0, str(REPO / "tools"))
