"""Deterministic tiny random-weight models for tests and benchmarks.

Nothing is downloaded: tokenizers are trained locally with the ``tokenizers`` library on
a synthetic corpus generated in code, weights are drawn from a fixed torch seed and saved
as fp32 safetensors. Every model directory is a plain Hugging Face checkpoint that loads
with ``transformers`` (``AutoModelForCausalLM`` / ``AutoModel`` + ``AutoTokenizer``) and
with vLLM (``vllm.LLM(model=path)``).

Usage::

    from tiny_models import ensure_tiny_model   # with <repo>/tools on sys.path
    path = ensure_tiny_model("llama")           # <repo>/.cache/tiny-models/llama-<hash>

    python tools/tiny_models.py [--root DIR] [names...]   # build (all by default), print paths

The directory name carries a short hash of the full spec (config, tokenizer recipe, weight
init and ``MAKER_VERSION``), so changing any of them builds a new directory. Builds go to a
temporary directory beside the final one and are moved into place with ``os.rename``; when
several processes race, the first rename wins and the others keep the winner's copy.
Building twice gives byte-identical ``model.safetensors`` and ``tokenizer.json``.

Models
------
``llama``
    ``LlamaForCausalLM``: hidden 128, 2 layers, 4 query heads and 2 KV heads (GQA),
    head_dim 32, intermediate 256, ``max_position_embeddings`` 4096, rope_theta 10000,
    untied ``lm_head``. Byte-level BPE (GPT-2 split), 1500 tokens; ids 0-4 are ``<s>``
    (BOS, prepended when encoding), ``</s>`` (EOS), ``<pad>``, ``<|im_start|>``,
    ``<|im_end|>``.
``qwen2``
    ``Qwen2ForCausalLM``: the same sizes, random non-zero q/k/v biases,
    ``tie_word_embeddings=True`` (no ``lm_head.weight`` in the file), rope_theta 1e6.
    Byte-level BPE with Qwen2's NFC + split regex (transformers rebuilds a ``qwen2``
    tokenizer with exactly that pipeline), 1500 tokens; ids 0-2 are ``<|endoftext|>``
    (pad), ``<|im_start|>``, ``<|im_end|>`` (EOS); no BOS, as in real Qwen2.
``bert``
    ``BertModel`` encoder (hidden 128, 2 layers, 4 heads, intermediate 256, 512 positions,
    exact-erf GELU) with a lower-casing WordPiece tokenizer, 1200 tokens; ids 0-4 are
    ``[PAD]``, ``[UNK]``, ``[CLS]``, ``[SEP]``, ``[MASK]``; input is wrapped in
    ``[CLS] ... [SEP]``. For embedding (pooling) tests, see below.

head_dim is 32 because vLLM's CPU attention backend supports head sizes 32, 64, 80, ...
only ("Unsupported CPU attention configuration: head_dim=16" otherwise). Config vocab sizes
equal the tokenizer sizes exactly.

Decoder chat template (in ``tokenizer_config.json``)::

    [bos_token]<|im_start|>{role}\\n{content}<|im_end|>\\n ... [<|im_start|>assistant\\n]

(``bos_token`` only for ``llama``, since vLLM tokenizes rendered chat prompts without
adding special tokens.)

Weights are well separated on purpose: weight matrices are drawn with std 0.2, the
``lm_head`` (qwen2: the tied embedding) with std 1.0, norm weights are
``1 + 0.1 * N(0, 1)`` and biases ``0.5 * N(0, 1)``. Over 16 prompts x 64 greedy steps the
smallest top-1/top-2 logit gap is 4.6e-3 (llama) and 1.3e-3 (qwen2), median about 2.4,
far above fp32 round-off, so two correct implementations produce the same greedy tokens.
(With the tied qwen2 embedding, smaller inner weights make the model just repeat its
input token; std 0.2 gives about 90% distinct tokens per continuation.)

Starting vLLM (0.32, CPU) on these needs only ``dtype="float32"`` and an explicit KV cache
size, e.g. ``kv_cache_memory_bytes=64 << 20``: without it the CPU worker reserves
``gpu_memory_utilization`` (0.92) of the NUMA node's memory and refuses to start when that
much is not free. ``max_model_len=1024`` and ``enforce_eager=True`` are optional (the latter
skips the ~25 s torch.compile warm-up).

BERT pooling recipe
-------------------
vLLM maps the architecture ``BertModel`` to its ``BertEmbeddingModel`` (a pooling model,
default runner ``pooling``). Its built-in default sequence pooling is CLS, so the directory
declares the pooling explicitly in sentence-transformers form, which vLLM reads in
``vllm.transformers_utils.config.get_pooling_config``:

* ``modules.json``: Transformer (path ``""``) -> ``sentence_transformers.models.Pooling``
  (path ``1_Pooling``) -> ``sentence_transformers.models.Normalize`` (path ``2_Normalize``);
* ``1_Pooling/config.json``: only ``pooling_mode_mean_tokens`` is true, giving
  ``seq_pooling_type="MEAN"``; the Normalize module gives ``use_activation=True``
  (L2 normalisation in the embedding head);
* ``sentence_bert_config.json``: ``max_seq_length`` 512, ``do_lower_case`` false (lower
  casing already happens in the tokenizer's normalizer).

So ``LLM(model=path, runner="pooling").embed(texts)`` returns mean-pooled, L2-normalised
last hidden states. The same embedding with Transformers::

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    enc = tok(texts, return_tensors="pt", padding=True)      # adds [CLS] ... [SEP]
    hidden = model(**enc).last_hidden_state                   # [B, T, 128]
    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    emb = (hidden * mask).sum(1) / mask.sum(1)                # mean over all real tokens,
    emb = torch.nn.functional.normalize(emb, p=2, dim=-1)     # [CLS]/[SEP] included

(``reference_embeddings`` below implements exactly this.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

MAKER_VERSION = "1"
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ROOT = REPO_ROOT / ".cache" / "tiny-models"

# Qwen2's pre-tokenizer split; transformers' Qwen2Tokenizer rebuilds its pipeline with
# exactly this (plus NFC), so the qwen2 vocabulary is trained with the same pipeline.
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHAT_TEMPLATE_WITH_BOS = "{{ bos_token }}" + CHAT_TEMPLATE


@dataclass(frozen=True)
class CorpusRecipe:
    seed: int = 20240601
    lexicon_size: int = 2500
    num_sentences: int = 6000


@dataclass(frozen=True)
class TokenizerRecipe:
    kind: str  # "bpe" (byte-level) or "wordpiece"
    vocab_size: int
    special_tokens: tuple[str, ...]  # get ids 0, 1, ... in this order
    pre_tokenizer: str  # "gpt2" (byte-level regex), "qwen2" (NFC + Qwen2 split) or "bert"
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    add_bos: bool = False  # prepend bos_token when encoding
    corpus: CorpusRecipe = field(default_factory=CorpusRecipe)


@dataclass(frozen=True)
class InitRecipe:
    seed: int
    std: float = 0.2  # weight matrices and embeddings
    head_std: float = 1.0  # lm_head (or the tied input embedding)
    norm_std: float = 0.1  # norm weights are 1 + norm_std * N(0, 1)
    bias_std: float = 0.5


@dataclass(frozen=True)
class ModelSpec:
    name: str
    architecture: str  # the transformers class and config "architectures" entry
    model_type: str
    config: dict[str, Any]  # config kwargs except vocab size and special token ids
    tokenizer: TokenizerRecipe
    init: InitRecipe

    def to_json(self) -> dict[str, Any]:
        return {"maker_version": MAKER_VERSION, **asdict(self)}

    @property
    def digest(self) -> str:
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def dirname(self) -> str:
        return f"{self.name}-{self.digest}"


# head_dim 32: vLLM's CPU attention backend supports head sizes 32, 64, 80, ... only.
_DECODER_COMMON: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.2,
    "use_cache": True,
}

SPECS: dict[str, ModelSpec] = {
    "llama": ModelSpec(
        name="llama",
        architecture="LlamaForCausalLM",
        model_type="llama",
        config={
            **_DECODER_COMMON,
            "rope_theta": 10000.0,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
        },
        tokenizer=TokenizerRecipe(
            kind="bpe",
            vocab_size=1500,
            special_tokens=("<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"),
            pre_tokenizer="gpt2",
            bos_token="<s>",
            eos_token="</s>",
            pad_token="<pad>",
            add_bos=True,
        ),
        init=InitRecipe(seed=1),
    ),
    "qwen2": ModelSpec(
        name="qwen2",
        architecture="Qwen2ForCausalLM",
        model_type="qwen2",
        config={
            **_DECODER_COMMON,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": 2,
        },
        tokenizer=TokenizerRecipe(
            kind="bpe",
            vocab_size=1500,
            special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
            pre_tokenizer="qwen2",
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
        ),
        init=InitRecipe(seed=2),
    ),
    "bert": ModelSpec(
        name="bert",
        architecture="BertModel",
        model_type="bert",
        config={
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "hidden_act": "gelu",
            "max_position_embeddings": 512,
            "type_vocab_size": 2,
            "layer_norm_eps": 1e-12,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            "initializer_range": 0.2,
        },
        tokenizer=TokenizerRecipe(
            kind="wordpiece",
            vocab_size=1200,
            special_tokens=("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
            pre_tokenizer="bert",
            pad_token="[PAD]",
        ),
        init=InitRecipe(seed=3),
    ),
}

MODEL_NAMES: tuple[str, ...] = tuple(SPECS)


# --------------------------------------------------------------------------- corpus


_ENGLISH_TEXT = (
    "the of and a to in is was that for it with as on be at by this had not are but from "
    "or have an they which you were her all she there would their we him been has when who "
    "will more no if out so said what up its about into than them can only other new some "
    "could time these two may then do first any my now such like our over man me even most "
    "made after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still "
    "own see men work long get here between both life being under never day same another "
    "know while last might us great old year off come since against go came right used take "
    "three hello capital france paris city river mountain story tell once upon king queen "
    "name number answer question what why who please thank yes today tomorrow computer "
    "language model machine learning quick brown fox jumps lazy dog red green blue"
)
_ENGLISH = tuple(_ENGLISH_TEXT.split())
_ONSETS = (
    "", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
    "z", "ch", "sh", "th", "st", "tr", "br", "pl", "gr", "qu",
)  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u", "y", "ai", "ea", "ou", "ie", "oo")
_CODAS = ("", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ck", "ng", "x")
_PUNCT_END = (".", ".", ".", "?", "!")


def synthetic_corpus(recipe: CorpusRecipe) -> list[str]:
    """Deterministic pseudo-text: Zipf-distributed made-up words plus common English."""
    rng = random.Random(recipe.seed)
    made_up: set[str] = set()
    lexicon: list[str] = []
    while len(lexicon) < recipe.lexicon_size:
        word = "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
            for _ in range(rng.choice((1, 1, 2, 2, 2, 3)))
        )
        if word not in made_up:
            made_up.add(word)
            lexicon.append(word)
    # Interleave English words at the head of the Zipf ranking.
    words = [w for pair in zip(_ENGLISH, lexicon, strict=False) for w in pair]
    words += lexicon[len(_ENGLISH) :]
    weights = [1.0 / (rank + 1) for rank in range(len(words))]

    lines = []
    for _ in range(recipe.num_sentences):
        n = rng.randint(4, 14)
        sent = rng.choices(words, weights=weights, k=n)
        if rng.random() < 0.3:
            sent.insert(rng.randrange(len(sent)), str(rng.randint(0, 2025)))
        if rng.random() < 0.3:
            i = rng.randrange(1, len(sent))
            sent[i - 1] += ","
        if rng.random() < 0.2:
            sent = [w.capitalize() if rng.random() < 0.3 else w for w in sent]
        sent[0] = sent[0].capitalize()
        lines.append(" ".join(sent) + rng.choice(_PUNCT_END))
    # Cover every printable ASCII character, alone and inside words, so WordPiece has
    # both "x" and "##x" for each and never needs [UNK] on ASCII text.
    printable = [chr(c) for c in range(33, 127)]
    lines.append(" ".join(printable))
    lines.append(" ".join(f"a{c}{c}b" for c in printable if c.isalnum()))
    return lines


# ------------------------------------------------------------------------ tokenizers


def train_tokenizer(recipe: TokenizerRecipe) -> Tokenizer:
    """Train the tokenizer described by ``recipe`` (deterministic for a given recipe)."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    corpus = synthetic_corpus(recipe.corpus)
    if recipe.kind == "bpe":
        tok = Tokenizer(models.BPE())
        if recipe.pre_tokenizer == "gpt2":
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        elif recipe.pre_tokenizer == "qwen2":
            tok.normalizer = normalizers.NFC()
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(
                        Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False
                    ),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        else:
            raise ValueError(f"unknown BPE pre-tokenizer {recipe.pre_tokenizer!r}")
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=recipe.vocab_size,
            min_frequency=2,
            special_tokens=list(recipe.special_tokens),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(corpus, trainer=trainer)
        if recipe.add_bos:
            assert recipe.bos_token is not None
            bos = recipe.bos_token
            tok.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A",
                pair=f"{bos} $A {bos} $B",
                special_tokens=[(bos, tok.token_to_id(bos))],
            )
        else:
            tok.post_processor = processors.ByteLevel(
                add_prefix_space=False, trim_offsets=False, use_regex=False
            )
    elif recipe.kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        # The WordPiece trainer numbers "##x" pieces in hash-map order, which differs
        # between processes and then changes merge tie-breaks. Seeding every "##x" as a
        # leading token in sorted order makes training deterministic; the tokenizer is
        # then rebuilt from the vocabulary so that only the real specials are special.
        inner = sorted(
            {
                ch
                for line in corpus
                for word, _ in tok.pre_tokenizer.pre_tokenize_str(
                    tok.normalizer.normalize_str(line)
                )
                for ch in word[1:]
            }
        )
        trainer = trainers.WordPieceTrainer(
            vocab_size=recipe.vocab_size,
            min_frequency=1,
            special_tokens=[*recipe.special_tokens, *(f"##{ch}" for ch in inner)],
            continuing_subword_prefix="##",
            show_progress=False,
        )
        tok.train_from_iterator(corpus, trainer=trainer)
        vocab = tok.get_vocab(with_added_tokens=True)
        trained = tok
        tok = Tokenizer(
            models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100)
        )
        tok.normalizer = trained.normalizer
        tok.pre_tokenizer = trained.pre_tokenizer
        tok.decoder = decoders.WordPiece(prefix="##")
        tok.add_special_tokens(list(recipe.special_tokens))
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[(t, tok.token_to_id(t)) for t in ("[CLS]", "[SEP]")],
        )
    else:
        raise ValueError(f"unknown tokenizer kind {recipe.kind!r}")
    return tok


def _tokenizer_files(spec: ModelSpec, tok: Tokenizer) -> dict[str, Any]:
    """tokenizer_config.json content for ``tok``."""
    common: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
    }
    recipe = spec.tokenizer
    if recipe.kind == "bpe":
        return {
            **common,
            "bos_token": recipe.bos_token,
            "eos_token": recipe.eos_token,
            "pad_token": recipe.pad_token,
            "unk_token": None,
            "add_bos_token": recipe.add_bos,
            "add_eos_token": False,
            "model_max_length": spec.config["max_position_embeddings"],
            "padding_side": "left",
            "chat_template": CHAT_TEMPLATE_WITH_BOS if recipe.add_bos else CHAT_TEMPLATE,
        }
    return {
        **common,
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "mask_token": "[MASK]",
        "do_lower_case": True,
        "model_max_length": spec.config["max_position_embeddings"],
        "padding_side": "right",
    }


# -------------------------------------------------------------------------- weights


def _make_config(spec: ModelSpec, tok: Tokenizer) -> Any:
    import transformers

    kwargs = dict(spec.config)
    kwargs["vocab_size"] = tok.get_vocab_size()
    recipe = spec.tokenizer
    for key in ("bos_token", "eos_token", "pad_token"):
        token = getattr(recipe, key)
        kwargs[f"{key}_id"] = None if token is None else tok.token_to_id(token)
    config_cls = transformers.AutoConfig.for_model(spec.model_type).__class__
    config = config_cls(**kwargs)
    config.architectures = [spec.architecture]
    config.dtype = "float32"
    return config


def _init_weights(model: torch.nn.Module, init: InitRecipe, head_names: set[str]) -> None:
    """Overwrite every parameter from one seeded generator, in module order."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(init.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # tied parameters appear once
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if name in head_names:
                value = noise * init.head_std
            elif name.endswith(".bias"):
                value = noise * init.bias_std
            elif param.ndim == 1:  # RMSNorm / LayerNorm weight
                value = 1.0 + noise * init.norm_std
            else:
                value = noise * init.std
            param.copy_(value)


def _build_model(spec: ModelSpec, tok: Tokenizer, out: Path) -> None:
    import torch
    import transformers
    from safetensors.torch import save_file

    config = _make_config(spec, tok)
    model_cls = getattr(transformers, spec.architecture)
    torch.manual_seed(spec.init.seed)
    model = model_cls(config).to(torch.float32).eval()

    tied = bool(getattr(config, "tie_word_embeddings", False))
    if spec.tokenizer.kind == "bpe":
        head = "model.embed_tokens.weight" if tied else "lm_head.weight"
        head_names = {head}
    else:
        head_names = set()
    _init_weights(model, spec.init, head_names)

    state = model.state_dict()
    if tied:
        state.pop("lm_head.weight", None)
    tensors = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in state.items()}
    save_file(dict(sorted(tensors.items())), str(out / "model.safetensors"), {"format": "pt"})

    config.save_pretrained(out)
    if spec.tokenizer.kind == "bpe":
        gen_config = {
            "bos_token_id": config.bos_token_id,
            "eos_token_id": config.eos_token_id,
            "pad_token_id": config.pad_token_id,
            "do_sample": False,
        }
        _write_json(out / "generation_config.json", gen_config)


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_sentence_transformers_files(spec: ModelSpec, out: Path) -> None:
    st = "sentence_transformers.models"
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": f"{st}.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": f"{st}.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": f"{st}.Normalize"},
    ]
    _write_json(out / "modules.json", modules)
    _write_json(
        out / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": spec.config["hidden_size"],
            "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True,
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_weightedmean_tokens": False,
            "pooling_mode_lasttoken": False,
            "include_prompt": True,
        },
    )
    (out / "2_Normalize").mkdir(exist_ok=True)
    _write_json(
        out / "sentence_bert_config.json",
        {"max_seq_length": spec.config["max_position_embeddings"], "do_lower_case": False},
    )


def build_model(spec: ModelSpec, out: Path) -> None:
    """Write the complete model directory for ``spec`` into the existing directory ``out``."""
    tok = train_tokenizer(spec.tokenizer)
    tok.save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", _tokenizer_files(spec, tok))
    _build_model(spec, tok, out)
    if spec.tokenizer.kind == "wordpiece":
        _write_sentence_transformers_files(spec, out)
    _write_json(out / "tiny_model_spec.json", {**spec.to_json(), "digest": spec.digest})


# ----------------------------------------------------------------------------- API


def _make_world_readable(top: Path) -> None:
    """mkdtemp and safetensors create owner-only entries; open them up like a checkout."""
    for path in (top, *top.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)


def ensure_tiny_model(name: str, root: Path | None = None) -> Path:
    """Return the directory of tiny model ``name``, building it first if it is missing.

    ``root`` defaults to ``<repo>/.cache/tiny-models``. Safe to call from several
    processes at once: each builds privately and the first to finish publishes.
    """
    try:
        spec = SPECS[name]
    except KeyError:
        raise ValueError(f"unknown tiny model {name!r}; known: {', '.join(SPECS)}") from None
    root = Path(root) if root is not None else DEFAULT_ROOT
    final = root / spec.dirname
    if not final.is_dir():
        publish_build(spec, final)
    return final


def publish_build(spec: ModelSpec, final: Path) -> None:
    """Build ``spec`` in a temporary directory beside ``final`` and rename it into place.

    If ``final`` appears meanwhile (another process won the race), the existing directory
    is kept and the private build is discarded.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-{os.getpid()}-", dir=final.parent))
    try:
        build_model(spec, tmp)
        _make_world_readable(tmp)
        try:
            os.rename(tmp, final)  # atomic; fails if final exists and is not empty
        except OSError:
            if not final.is_dir():  # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def reference_embeddings(path: Path, texts: Sequence[str]) -> torch.Tensor:
    """Transformers reference for the ``bert`` model: mean pooling + L2 normalisation."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    enc = tok(list(texts), return_tensors="pt", padding=True)
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    emb = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(emb, p=2, dim=-1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", type=Path, default=None, help=f"default: {DEFAULT_ROOT}")
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(SPECS)}")
    args = parser.parse_args(argv)
    if unknown := [n for n in args.names if n not in SPECS]:
        parser.error(f"unknown model(s): {', '.join(unknown)}; known: {', '.join(SPECS)}")
    for name in args.names or MODEL_NAMES:
        print(ensure_tiny_model(name, args.root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
