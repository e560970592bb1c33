"""Ascend options, read from vLLM's ``--additional-config`` into a typed config.

The options live under the key ``"ascend"`` of the additional config, e.g.::

    vllm serve MODEL --additional-config '{"ascend": {"reference_num_threads": 2}}'

Other top-level keys belong to other plugins and are left alone. Inside ``"ascend"`` an
unknown key or a value of the wrong type is an error that names the key and says what is
allowed: a typo must not silently run with defaults.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

ADDITIONAL_CONFIG_KEY = "ascend"


class AscendConfigError(ValueError):
    """An Ascend option in ``--additional-config`` is unknown or has a wrong value."""


@dataclasses.dataclass(frozen=True)
class AscendConfig:
    """The Ascend platform's options (all optional).

    Attributes:
        reference_num_threads: torch intra-op threads of each worker on the CPU reference
            device (default: torch's own choice). Ignored on an NPU.
        check_block_size: require the KV block size to be one the NPU paged-attention
            kernel accepts (a multiple of 128). On by default so that a configuration that
            would fail on the NPU fails on the reference device too.
    """

    reference_num_threads: int | None = None
    check_block_size: bool = True

    @classmethod
    def from_additional_config(cls, additional_config: Any) -> AscendConfig:
        """Parse vLLM's ``additional_config`` (a dict, or a JSON string)."""
        if additional_config is None:
            return cls()
        if isinstance(additional_config, str):
            try:
                additional_config = json.loads(additional_config)
            except json.JSONDecodeError as exc:
                raise AscendConfigError(
                    f"--additional-config is not valid JSON: {exc.msg} "
                    f"(line {exc.lineno}, column {exc.colno})"
                ) from None
        if not isinstance(additional_config, Mapping):
            raise AscendConfigError(
                f"--additional-config must be a JSON object, got {type(additional_config).__name__}"
            )
        options = additional_config.get(ADDITIONAL_CONFIG_KEY, {})
        if not isinstance(options, Mapping):
            raise AscendConfigError(
                f'--additional-config option "{ADDITIONAL_CONFIG_KEY}" must be a JSON '
                f"object of Ascend options, got {type(options).__name__}"
            )
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in options.items():
            if key not in fields:
                raise AscendConfigError(
                    f'unknown Ascend option "{ADDITIONAL_CONFIG_KEY}.{key}" in '
                    f"--additional-config; allowed: {', '.join(sorted(fields))}"
                )
            values[key] = _check_value(key, value)
        return cls(**values)


def _check_value(key: str, value: Any) -> Any:
    name = f'"{ADDITIONAL_CONFIG_KEY}.{key}"'
    if key == "reference_num_threads":
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise AscendConfigError(
                f"Ascend option {name} must be a positive integer or null, got {value!r}"
            )
        return value
    if key == "check_block_size":
        if not isinstance(value, bool):
            raise AscendConfigError(f"Ascend option {name} must be true or false, got {value!r}")
        return value
    raise AssertionError(f"no validator for {key}")  # every field has one above
