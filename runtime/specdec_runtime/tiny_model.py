"""Tiny Llama checkpoints made on this machine, for running the real vLLM engine without downloading anything.

`specdec-runtime tiny-model --out DIR` writes, deterministically from a seed:

- `DIR/target`: a random-weight Llama (hidden 128, 2 layers, 4 heads, 2 KV heads, bf16 safetensors, ~1 MB) with a
  byte-level BPE tokenizer trained here by the `tokenizers` package on generated text, a one-line chat template and
  a generation config;
- `DIR/drafter-NAME` for each `--drafter NAME=ACCEPTANCE`: the target's weights plus seeded Gaussian noise, the noise
  scale found by bisection so that the drafter's greedy next token agrees with the target's at the given rate along
  the target's own greedy continuations of held-out prompts (the per-token acceptance of `draft_model` speculation
  under greedy sampling: position i of a draft is then accepted with about ACCEPTANCE**(i+1));
- `DIR/manifest.json`: what was built, from which seed, and each drafter's measured agreement.

The forward pass used for the calibration is a plain numpy Llama (RMSNorm, rotary embeddings, grouped-query causal
attention, SwiGLU) on the bf16-rounded weights vLLM loads. numpy is the only import needed for the weights;
`tokenizers` (a vLLM dependency) trains the tokenizer, so the command runs in the engine's venv
(`hack/tiny-models` does that and caches the result).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

FORMAT_VERSION = 1  # bump when the files written change, so caches are rebuilt
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
DEFAULT_DRAFTERS = {"same": 1.0, "good": 0.8, "poor": 0.2}

Array = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Shape:
    vocab_size: int = 800
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    # Large enough for any --max-model-len a spec renders; the KV cache of 512 bytes a token costs nothing until used.
    max_position_embeddings: int = 131072
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def corpus(seed: int, lines: int = 4000) -> list[str]:
    """Generated English-like text: the tokenizer's training data and the calibration prompts."""
    rng = np.random.default_rng(seed)
    syllables = ["ta", "ke", "ro", "mi", "su", "na", "lo", "vi", "de", "pa", "tok", "an", "el", "or", "ing", "er"]
    words = sorted({"".join(rng.choice(syllables, size=int(rng.integers(1, 4)))) for _ in range(600)})
    words += ["the", "a", "of", "to", "and", "in", "is", "model", "draft", "token", "user", "assistant"]
    out = []
    for _ in range(lines):
        n = int(rng.integers(4, 16))
        out.append(" ".join(str(w) for w in rng.choice(words, size=n)) + ".")
    return out


def train_tokenizer(out: Path, shape: Shape, seed: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus(seed), trainer=trainer)
    for token, token_id in zip(SPECIAL_TOKENS, (UNK_ID, BOS_ID, EOS_ID), strict=True):
        if tokenizer.token_to_id(token) != token_id:
            raise RuntimeError(f"tokenizer put {token} at {tokenizer.token_to_id(token)}, not {token_id}")
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": False, "model_max_length": shape.max_position_embeddings, "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=2) + "\n")
    return tokenizer


def to_bf16_bits(array: Array) -> npt.NDArray[np.uint16]:
    """float32 -> bfloat16 bit patterns, rounding to nearest even (as torch does)."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def from_bf16_bits(bits: npt.NDArray[np.uint16]) -> Array:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def bf16_round(array: Array) -> Array:
    return from_bf16_bits(to_bf16_bits(array))


def write_safetensors(path: Path, tensors: dict[str, Array]) -> None:
    """The safetensors format by hand (an 8-byte header length, a JSON header, then the raw data), in bf16."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        blob = to_bf16_bits(tensors[name]).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with path.open("wb") as sink:
        sink.write(struct.pack("<Q", len(encoded)))
        sink.write(encoded)
        for blob in blobs:
            sink.write(blob)


def random_weights(shape: Shape, seed: int) -> dict[str, Array]:
    """Scaled so that the next-token distribution is peaked (a greedy continuation is not a coin toss)."""
    rng = np.random.default_rng(seed)

    def normal(rows: int, cols: int, std: float) -> Array:
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    h, i, d = shape.hidden_size, shape.intermediate_size, shape.head_dim
    weights = {"model.embed_tokens.weight": normal(shape.vocab_size, h, 1.0)}
    for layer in range(shape.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        weights |= {
            prefix + "input_layernorm.weight": np.ones(h, dtype=np.float32),
            prefix + "post_attention_layernorm.weight": np.ones(h, dtype=np.float32),
            prefix + "self_attn.q_proj.weight": normal(shape.num_attention_heads * d, h, h**-0.5),
            prefix + "self_attn.k_proj.weight": normal(shape.num_key_value_heads * d, h, h**-0.5),
            prefix + "self_attn.v_proj.weight": normal(shape.num_key_value_heads * d, h, h**-0.5),
            prefix + "self_attn.o_proj.weight": normal(h, shape.num_attention_heads * d, h**-0.5),
            prefix + "mlp.gate_proj.weight": normal(i, h, h**-0.5),
            prefix + "mlp.up_proj.weight": normal(i, h, h**-0.5),
            prefix + "mlp.down_proj.weight": normal(h, i, i**-0.5),
        }
    weights["model.norm.weight"] = np.ones(h, dtype=np.float32)
    lm_head = normal(shape.vocab_size, h, 3.0 * h**-0.5)
    # Special tokens never win the argmax: a greedy continuation runs to max_tokens instead of stopping at random.
    lm_head[: len(SPECIAL_TOKENS)] = 0.0
    weights["lm_head.weight"] = lm_head
    return {name: bf16_round(value) for name, value in weights.items()}


def noisy_copy(weights: dict[str, Array], scale: float, seed: int) -> dict[str, Array]:
    """The target plus Gaussian noise of `scale` times each matrix's RMS (norm weights and special rows kept)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in sorted(weights):
        value = weights[name]
        if value.ndim == 2 and scale > 0:
            rms = float(np.sqrt(np.mean(value.astype(np.float64) ** 2))) or 1.0
            value = value + (rng.standard_normal(value.shape) * scale * rms).astype(np.float32)
            if name == "lm_head.weight":
                value[: len(SPECIAL_TOKENS)] = 0.0
        out[name] = bf16_round(value)
    return out


def _rms_norm(x: Array, weight: Array, eps: float) -> Array:
    normed: Array = (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight).astype(np.float32)
    return normed


def _rotary(x: Array, positions: npt.NDArray[np.int64], theta: float) -> Array:
    """Llama's rotate-half rotary embedding (vLLM's `is_neox_style` for Llama); x is (heads, seq, head_dim)."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / theta ** (np.arange(half, dtype=np.float64) * 2 / x.shape[-1])
    angles = positions[:, None].astype(np.float64) * inv_freq[None, :]
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    first, second = x[..., :half], x[..., half:]
    rotated: Array = np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return rotated


def logits(weights: dict[str, Array], shape: Shape, tokens: list[int]) -> Array:
    """Next-token logits at every position of `tokens` (a plain causal forward pass, no cache)."""
    seq = len(tokens)
    positions = np.arange(seq)
    d, heads, kv_heads = shape.head_dim, shape.num_attention_heads, shape.num_key_value_heads
    x = weights["model.embed_tokens.weight"][tokens]
    mask = np.triu(np.full((seq, seq), -np.inf, dtype=np.float32), k=1)
    for layer in range(shape.num_hidden_layers):
        p = f"model.layers.{layer}."
        h = _rms_norm(x, weights[p + "input_layernorm.weight"], shape.rms_norm_eps)
        q = (h @ weights[p + "self_attn.q_proj.weight"].T).reshape(seq, heads, d).transpose(1, 0, 2)
        k = (h @ weights[p + "self_attn.k_proj.weight"].T).reshape(seq, kv_heads, d).transpose(1, 0, 2)
        v = (h @ weights[p + "self_attn.v_proj.weight"].T).reshape(seq, kv_heads, d).transpose(1, 0, 2)
        q, k = _rotary(q, positions, shape.rope_theta), _rotary(k, positions, shape.rope_theta)
        group = heads // kv_heads
        k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(d) + mask
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        attention = (scores / scores.sum(axis=-1, keepdims=True)) @ v
        x = x + attention.transpose(1, 0, 2).reshape(seq, heads * d) @ weights[p + "self_attn.o_proj.weight"].T
        h = _rms_norm(x, weights[p + "post_attention_layernorm.weight"], shape.rms_norm_eps)
        gate = h @ weights[p + "mlp.gate_proj.weight"].T
        up = h @ weights[p + "mlp.up_proj.weight"].T
        x = x + ((gate / (1.0 + np.exp(-gate))) * up) @ weights[p + "mlp.down_proj.weight"].T
    x = _rms_norm(x, weights["model.norm.weight"], shape.rms_norm_eps)
    return (x @ weights["lm_head.weight"].T).astype(np.float32)


def greedy_paths(weights: dict[str, Array], shape: Shape, prompts: list[list[int]], steps: int) -> list[list[int]]:
    paths = []
    for prompt in prompts:
        tokens = list(prompt)
        for _ in range(steps):
            tokens.append(int(np.argmax(logits(weights, shape, tokens)[-1])))
        paths.append(tokens)
    return paths


def agreement(target_paths: list[tuple[int, list[int]]], drafter: dict[str, Array], shape: Shape) -> float:
    """How often the drafter's greedy next token equals the target's along the target's continuations."""
    agree = total = 0
    for prompt_len, path in target_paths:
        predicted = np.argmax(logits(drafter, shape, path[:-1]), axis=-1)[prompt_len - 1:]
        agree += int(np.sum(predicted == np.array(path[prompt_len:])))
        total += len(path) - prompt_len
    return agree / total


@dataclass
class DrafterReport:
    name: str
    wanted_acceptance: float
    noise_scale: float
    measured_agreement: float


def calibrate(weights: dict[str, Array], shape: Shape, paths: list[tuple[int, list[int]]], wanted: float,
              seed: int, rounds: int = 14) -> tuple[float, float, dict[str, Array]]:
    """Bisect the noise scale (agreement falls as noise grows) for the wanted agreement."""
    if wanted >= 1.0:
        return 0.0, 1.0, weights
    low, high = 0.0, 4.0
    best: tuple[float, float, dict[str, Array]] | None = None
    for _ in range(rounds):
        middle = (low + high) / 2
        candidate = noisy_copy(weights, middle, seed)
        measured = agreement(paths, candidate, shape)
        if best is None or abs(measured - wanted) < abs(best[1] - wanted):
            best = (middle, measured, candidate)
        if measured > wanted:
            low = middle
        else:
            high = middle
    assert best is not None
    return best


def config_json(shape: Shape) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": shape.hidden_size, "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers, "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads, "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_size, "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": shape.rms_norm_eps, "rope_theta": shape.rope_theta, "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
        "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": UNK_ID,
    }


def write_checkpoint(directory: Path, shape: Shape, weights: dict[str, Array], tokenizer_dir: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config_json(shape), indent=2) + "\n")
    # Greedy by default (vLLM reads generation_config.json for a request's unset sampling parameters): the drafters'
    # calibrated acceptance is a greedy agreement rate.
    (directory / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "temperature": 0.0, "do_sample": False}, indent=2) + "\n")
    write_safetensors(directory / "model.safetensors", weights)
    if tokenizer_dir != directory:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            (directory / name).write_bytes((tokenizer_dir / name).read_bytes())


def build(out: Path, drafters: dict[str, float], seed: int = 0, shape: Shape | None = None) -> dict[str, Any]:
    shape = shape or Shape()
    target_dir = out / "target"
    target_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(target_dir, shape, seed)
    weights = random_weights(shape, seed)
    write_checkpoint(target_dir, shape, weights, target_dir)
    held_out = corpus(seed + 1, lines=12)
    prompts = [[BOS_ID, *tokenizer.encode(line).ids[:12]] for line in held_out]
    paths = [(len(p), path) for p, path in zip(prompts, greedy_paths(weights, shape, prompts, 24), strict=True)]
    reports = []
    for index, (name, wanted) in enumerate(sorted(drafters.items())):
        scale, measured, drafter = calibrate(weights, shape, paths, wanted, seed=seed * 1000 + index + 1)
        write_checkpoint(out / f"drafter-{name}", shape, drafter, target_dir)
        reports.append(DrafterReport(name, wanted, round(scale, 5), round(measured, 4)))
    digest = hashlib.sha256((target_dir / "model.safetensors").read_bytes()).hexdigest()[:16]
    manifest = {
        "format_version": FORMAT_VERSION, "seed": seed, "shape": asdict(shape), "target": "target",
        "target_sha256_16": digest, "drafters": {r.name: asdict(r) | {"path": f"drafter-{r.name}"} for r in reports},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def parse_drafters(values: list[str]) -> dict[str, float]:
    drafters: dict[str, float] = {}
    for value in values:
        name, sep, rate = value.partition("=")
        try:
            acceptance = float(rate)
        except ValueError:
            acceptance = -1.0
        if not sep or not name or not name.replace("-", "").isalnum() or not 0.0 < acceptance <= 1.0:
            raise SystemExit(f"--drafter {value!r}: expected NAME=ACCEPTANCE with 0 < ACCEPTANCE <= 1")
        drafters[name] = acceptance
    return drafters


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdec-runtime tiny-model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory to write target/, drafter-*/ into")
    parser.add_argument("--drafter", action="append", default=[], metavar="NAME=ACCEPTANCE",
                        help="a drafter of that greedy per-token acceptance (default: same=1, good=0.8, poor=0.2)")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args(argv)
    drafters = parse_drafters(options.drafter) if options.drafter else dict(DEFAULT_DRAFTERS)
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        sys.stderr.write("tiny-model: the `tokenizers` package is missing: run it with the engine venv's python "
                         "(hack/tiny-models does)\n")
        return 2
    manifest = build(options.out, drafters, seed=options.seed)
    for name, report in sorted(manifest["drafters"].items()):
        sys.stdout.write(f"drafter-{name}: noise {report['noise_scale']}, greedy agreement "
                         f"{report['measured_agreement']} (wanted {report['wanted_acceptance']})\n")
    sys.stdout.write(f"wrote {options.out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
