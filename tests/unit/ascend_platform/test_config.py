"""Ascend options from --additional-config, and the platform's configuration checks.

Bad input must give one clear error that names the option (tested through vLLM's own
argument parsing and config construction, as a user meets it).
"""

from __future__ import annotations

import pytest
from ascend_platform.config import AscendConfig, AscendConfigError
from tiny_models import ensure_tiny_model


def test_defaults_when_absent() -> None:
    assert AscendConfig.from_additional_config({}) == AscendConfig()
    assert AscendConfig.from_additional_config(None) == AscendConfig()


def test_options_are_read_and_other_plugins_keys_left_alone() -> None:
    config = AscendConfig.from_additional_config(
        {"ascend": {"reference_num_threads": 2, "check_block_size": False}, "other": {"x": 1}}
    )
    assert config == AscendConfig(reference_num_threads=2, check_block_size=False)


def test_json_text_is_parsed() -> None:
    config = AscendConfig.from_additional_config('{"ascend": {"reference_num_threads": 3}}')
    assert config.reference_num_threads == 3


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{bad", "--additional-config is not valid JSON"),
        ("[1, 2]", "--additional-config must be a JSON object, got list"),
        ({"ascend": 5}, '--additional-config option "ascend" must be a JSON object'),
        (
            {"ascend": {"reference_threads": 2}},
            'unknown Ascend option "ascend.reference_threads" in --additional-config; '
            "allowed: check_block_size, reference_num_threads",
        ),
        (
            {"ascend": {"reference_num_threads": "two"}},
            'Ascend option "ascend.reference_num_threads" must be a positive integer or null, '
            "got 'two'",
        ),
        ({"ascend": {"reference_num_threads": 0}}, "must be a positive integer"),
        ({"ascend": {"reference_num_threads": True}}, "must be a positive integer"),
        ({"ascend": {"check_block_size": "yes"}}, '"ascend.check_block_size" must be true or'),
    ],
)
def test_bad_options_name_the_option(raw, message: str) -> None:
    with pytest.raises(AscendConfigError) as excinfo:
        AscendConfig.from_additional_config(raw)
    assert message in str(excinfo.value)


# --- through vLLM, with the reference platform active in this process --------------------


def engine_config(*cli: str):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    model = str(ensure_tiny_model("llama"))
    args = parser.parse_args(["--model", model, "--max-model-len", "1024", *cli])
    return EngineArgs.from_cli_args(args).create_engine_config()


def test_platform_settings() -> None:
    from vllm.config import CUDAGraphMode

    config = engine_config("--dtype", "float32")
    assert config.device_config.device_type == "cpu"
    assert config.parallel_config.worker_cls == "ascend_platform.worker.worker.AscendWorker"
    assert config.cache_config.block_size == 128
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.NONE
    assert config.compilation_config.backend == "eager"
    assert config.scheduler_config.async_scheduling is False


def test_inductor_request_becomes_eager_before_custom_op_defaults() -> None:
    # vLLM turns custom ops off ("none") for inductor; on Ascend they must stay on.
    config = engine_config("--compilation-config", '{"backend": "inductor"}')
    assert config.compilation_config.backend == "eager"
    assert "none" not in config.compilation_config.custom_ops


def test_scheduler_and_worker_agree_on_the_v1_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    # Where Triton exists (an NPU host with triton-ascend) vLLM would pick its V2 runner
    # for the scheduler, while the Ascend worker runs the V1 runner.
    import vllm.config.vllm as vllm_config_module

    monkeypatch.setattr(vllm_config_module, "HAS_TRITON", True)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    config = engine_config("--dtype", "float32")
    assert config.use_v2_model_runner is False


@pytest.mark.parametrize(
    ("cli", "message"),
    [
        (
            ("--additional-config", '{"ascend": {"nope": 1}}'),
            'unknown Ascend option "ascend.nope"',
        ),
        (
            ("--additional-config", '{"ascend": {"check_block_size": 1}}'),
            '"ascend.check_block_size" must be true or false, got 1',
        ),
        (("--quantization", "fp8"), "--quantization 'fp8' is not supported by the Ascend"),
        (("--kv-cache-dtype", "fp8"), "--kv-cache-dtype 'fp8' is not supported"),
        (("--block-size", "64"), "--block-size 64 is not supported by the NPU paged-attention"),
        (("--enable-lora",), "--enable-lora is not supported"),
    ],
)
def test_bad_input_through_vllm(cli: tuple[str, ...], message: str) -> None:
    with pytest.raises(Exception) as excinfo:  # vLLM may wrap our ValueError
        engine_config(*cli)
    assert message in str(excinfo.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{bad", "argument --additional-config: not valid JSON: Expecting property name"),
        ("[1]", "argument --additional-config: must be a JSON object, got '[1]'"),
    ],
)
def test_malformed_additional_config_is_an_argument_error(
    text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # vllm serve builds its parser with AsyncEngineArgs, which lets the platform adjust it.
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    with pytest.raises(SystemExit):
        parser.parse_args(["--model", "m", "--additional-config", text])
    assert message in capsys.readouterr().err


def test_block_size_check_can_be_lifted_on_the_reference_device() -> None:
    config = engine_config(
        "--block-size", "64", "--additional-config", '{"ascend": {"check_block_size": false}}'
    )
    assert config.cache_config.block_size == 64


def test_unsupported_dtype_is_named() -> None:
    from vllm.platforms import current_platform

    with pytest.raises(ValueError, match="--dtype float64 is not supported on cpu"):
        current_platform.check_if_supports_dtype(__import__("torch").float64)
