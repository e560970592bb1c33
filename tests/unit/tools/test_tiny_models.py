"""The tiny-model maker (tools/tiny_models.py): determinism, loadability, config properties."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[3] / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

import tiny_models as tm  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

DECODERS = ("llama", "qwen2")
TEXTS = (
    "Hello, world! The capital of France is Paris.",
    "  two  spaces, a tab\tand\nnew lines\n\n1234567890 #$%&",
    "It's we've they'll - zotmot was the question?",
    "café naïve ÅΩ 日本語 🙂",
)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="module")
def paths(root: Path) -> dict[str, Path]:
    return {name: tm.ensure_tiny_model(name, root) for name in tm.MODEL_NAMES}


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    return safetensors_torch.load_file(str(path / "model.safetensors"))


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


# ----------------------------------------------------------------- build and cache


def test_layout_and_names(paths: dict[str, Path], root: Path) -> None:
    for name, path in paths.items():
        spec = tm.SPECS[name]
        assert path == root / f"{name}-{spec.digest}"
        assert len(spec.digest) == 12
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            assert (path / f).is_file(), f
        recorded = json.loads((path / "tiny_model_spec.json").read_text())
        assert recorded["digest"] == spec.digest
        assert recorded["maker_version"] == tm.MAKER_VERSION
    assert not [p for p in root.iterdir() if p.name.startswith(".")], "temp dirs left behind"


def test_existing_model_is_reused(paths: dict[str, Path], root: Path) -> None:
    marker = paths["bert"] / "marker"
    marker.write_text("x")
    try:
        assert tm.ensure_tiny_model("bert", root) == paths["bert"]
        assert marker.exists()
    finally:
        marker.unlink()


def test_default_root_is_repo_cache() -> None:
    expected = TOOLS.parent / ".cache" / "tiny-models"
    assert expected == tm.DEFAULT_ROOT


def test_spec_change_changes_directory() -> None:
    spec = tm.SPECS["llama"]
    seed = dataclasses.replace(spec, init=dataclasses.replace(spec.init, seed=99))
    layers = dataclasses.replace(spec, config={**spec.config, "num_hidden_layers": 3})
    recipe = dataclasses.replace(spec.tokenizer, vocab_size=1400)
    vocab = dataclasses.replace(spec, tokenizer=recipe)
    digests = {s.digest for s in (spec, seed, layers, vocab)}
    assert len(digests) == 4
    assert len({s.digest for s in tm.SPECS.values()}) == len(tm.SPECS)


def test_unknown_model_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown tiny model"):
        tm.ensure_tiny_model("gpt5", tmp_path)


def test_deterministic_across_builds(paths: dict[str, Path], tmp_path: Path) -> None:
    for name, first in paths.items():
        second = tm.ensure_tiny_model(name, tmp_path)
        assert second.name == first.name
        for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            assert (first / f).read_bytes() == (second / f).read_bytes(), (name, f)


def test_tokenizer_training_deterministic_across_processes() -> None:
    # tokenizers' trainers use hash maps seeded per process; compare with a fresh process.
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import tiny_models as tm\n"
        "for s in tm.SPECS.values(): print(tm.train_tokenizer(s.tokenizer).to_str())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(TOOLS)], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    here = [tm.train_tokenizer(s.tokenizer).to_str() for s in tm.SPECS.values()]
    assert out == here


def test_lost_race_keeps_the_winner(tmp_path: Path) -> None:
    spec = tm.SPECS["bert"]
    final = tmp_path / spec.dirname
    final.mkdir()
    (final / "winner").write_text("first")
    tm.publish_build(spec, final)  # builds privately, loses the rename, keeps the winner
    assert (final / "winner").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == [spec.dirname]


def test_concurrent_callers_get_one_directory(tmp_path: Path) -> None:
    results: list[Path] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            results.append(tm.ensure_tiny_model("bert", tmp_path))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(results)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [results[0].name]


def test_cli_prints_paths(paths: dict[str, Path], root: Path, capsys) -> None:
    assert tm.main(["--root", str(root), "qwen2", "bert"]) == 0
    assert capsys.readouterr().out.split() == [str(paths["qwen2"]), str(paths["bert"])]
    with pytest.raises(SystemExit):
        tm.main(["--root", str(root), "nope"])


# ------------------------------------------------------------------ model contents


def test_weights_fp32_and_well_spread(paths: dict[str, Path]) -> None:
    for name, path in paths.items():
        tensors = _tensors(path)
        assert all(t.dtype == torch.float32 for t in tensors.values()), name
        for key, t in tensors.items():
            if t.ndim == 2:
                assert 0.15 < float(t.std()) < 1.2, (name, key)


@pytest.mark.parametrize("name", DECODERS)
def test_decoder_config(paths: dict[str, Path], name: str) -> None:
    path = paths[name]
    cfg = transformers.AutoConfig.from_pretrained(path)
    assert cfg.architectures == [tm.SPECS[name].architecture]
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # GQA
    assert cfg.num_attention_heads % cfg.num_key_value_heads == 0
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert head_dim == 32  # vLLM's CPU attention needs head_dim >= 32
    assert cfg.max_position_embeddings >= 2048
    tok = transformers.AutoTokenizer.from_pretrained(path)
    assert cfg.vocab_size == len(tok) == tok.backend_tokenizer.get_vocab_size()
    assert 1000 <= cfg.vocab_size <= 2000
    assert cfg.eos_token_id == tok.eos_token_id
    assert cfg.pad_token_id == tok.pad_token_id
    assert cfg.bos_token_id == tok.bos_token_id


def test_llama_specifics(paths: dict[str, Path]) -> None:
    cfg = _config(paths["llama"])
    assert cfg["rope_parameters"]["rope_theta"] == 10000.0
    assert cfg["tie_word_embeddings"] is False
    tensors = _tensors(paths["llama"])
    assert "lm_head.weight" in tensors
    assert not [k for k in tensors if k.endswith(".bias")]


def test_qwen2_bias_and_tied_embeddings(paths: dict[str, Path]) -> None:
    cfg = _config(paths["qwen2"])
    assert cfg["tie_word_embeddings"] is True
    tensors = _tensors(paths["qwen2"])
    assert "lm_head.weight" not in tensors
    for layer in range(cfg["num_hidden_layers"]):
        for proj in ("q_proj", "k_proj", "v_proj"):
            bias = tensors[f"model.layers.{layer}.self_attn.{proj}.bias"]
            assert bool((bias != 0).all())
            assert float(bias.abs().mean()) > 0.1
    model = transformers.AutoModelForCausalLM.from_pretrained(paths["qwen2"])
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("name", DECODERS)
def test_decoder_loads_and_generates(paths: dict[str, Path], name: str) -> None:
    path = paths[name]
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert type(model).__name__ == tm.SPECS[name].architecture
    loaded = model.state_dict()
    for key, t in _tensors(path).items():  # every stored tensor arrived unchanged
        assert torch.equal(loaded[key], t), key
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = tok("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    top2 = logits.topk(2).values
    assert float(top2[0] - top2[1]) > 1e-3
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", DECODERS)
def test_decoder_tokenizer_round_trip(paths: dict[str, Path], name: str) -> None:
    from tokenizers import Tokenizer

    path = paths[name]
    tok = transformers.AutoTokenizer.from_pretrained(path)
    raw = Tokenizer.from_file(str(path / "tokenizer.json"))
    add_bos = tm.SPECS[name].tokenizer.add_bos
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        assert ids == raw.encode(text).ids  # transformers' class agrees with tokenizer.json
        assert (ids[0] == tok.bos_token_id) == add_bos
        assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(tok(TEXTS[0], add_special_tokens=False)["input_ids"]) == TEXTS[0]
    assert len(tok(TEXTS[0])["input_ids"]) < len(TEXTS[0]) / 2  # merges were learnt


@pytest.mark.parametrize("name", DECODERS)
def test_chat_template_renders(paths: dict[str, Path], name: str) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(paths[name])
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    bos = "<s>" if tm.SPECS[name].tokenizer.add_bos else ""
    assert text == (
        f"{bos}<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3
    assert ids.count(tok.convert_tokens_to_ids("<|im_end|>")) == 2


def test_bert_config_and_tokenizer(paths: dict[str, Path]) -> None:
    path = paths["bert"]
    cfg = transformers.AutoConfig.from_pretrained(path)
    assert cfg.architectures == ["BertModel"]
    tok = transformers.AutoTokenizer.from_pretrained(path)
    assert cfg.vocab_size == len(tok) == tok.backend_tokenizer.get_vocab_size()
    assert cfg.pad_token_id == tok.pad_token_id
    for special in ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"):
        assert special in tok.all_special_tokens
    ascii_text = "".join(chr(c) for c in range(32, 127))
    tokens = tok.convert_ids_to_tokens(tok(ascii_text)["input_ids"])
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    assert "[UNK]" not in tokens
    text = "Hello, world! The capital of France is Paris. 1234"
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text.lower()


def test_bert_sentence_transformers_pooling(paths: dict[str, Path]) -> None:
    path = paths["bert"]
    modules = json.loads((path / "modules.json").read_text())
    types = [m["type"].rsplit(".", 1)[-1] for m in modules]
    assert types == ["Transformer", "Pooling", "Normalize"]
    pooling = json.loads((path / modules[1]["path"] / "config.json").read_text())
    enabled = [k for k, v in pooling.items() if v is True]
    assert sorted(enabled) == ["include_prompt", "pooling_mode_mean_tokens"]
    assert pooling["word_embedding_dimension"] == _config(path)["hidden_size"]
    st = json.loads((path / "sentence_bert_config.json").read_text())
    assert st["max_seq_length"] == 512


def test_bert_reference_embeddings(paths: dict[str, Path]) -> None:
    path = paths["bert"]
    texts = ["Hello, world!", "A longer sentence about the capital of France.", "a"]
    emb = tm.reference_embeddings(path, texts)
    assert emb.shape == (3, _config(path)["hidden_size"])
    torch.testing.assert_close(emb.norm(dim=-1), torch.ones(3))
    one = tm.reference_embeddings(path, texts[1:2])  # padding does not change the result
    torch.testing.assert_close(one[0], emb[1], atol=1e-6, rtol=0)
    assert float(emb[0] @ emb[1]) < 0.999  # distinct inputs, distinct embeddings
