"""The suite's ``VLLM_*`` environment variables declared to vLLM.

vLLM checks every ``VLLM_*`` variable of the environment against its own table
(``vllm.envs.environment_variables``) when it builds the engine config, warns about each
one it does not know, and refuses to start when asked to validate strictly
(``fail_on_environ_validation``). The suite's variables are legitimate and vLLM offers no
way for a plugin to declare them.
"""

from __future__ import annotations

import os
from typing import Any

from ascend_patches.core import PATCHES, VERSION_ENV

SUITE_VARIABLES = ("VLLM_ASCEND_DEVICE", VERSION_ENV)


def _getter(name: str) -> Any:
    return lambda: os.environ.get(name)


@PATCHES.declare(
    target="vllm.envs.environment_variables",
    stage="platform",
    versions=">=0.31,<0.33",
    why=(
        "VLLM_ASCEND_DEVICE (the platform's device choice) and VLLM_VERSION (this package's "
        "version override) are reported as unknown vLLM variables, an error under strict "
        "environment validation."
    ),
    how="Replace vLLM's table of variables by a copy that also lists the suite's.",
    upstream=(
        "None: vLLM has no plugin API to declare environment variables; a Platform "
        "attribute for it would be the upstream fix."
    ),
    removal="Remove when vLLM lets plugins declare their environment variables.",
)
def declare_suite_variables(original: Any) -> Any:
    return {**original, **{name: _getter(name) for name in SUITE_VARIABLES}}
