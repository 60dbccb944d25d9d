"""The tiny checkpoints for the real engine: bf16 safetensors written by hand, calibrated noisy drafters."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from specdec_runtime import tiny_model
from specdec_runtime.tiny_model import Shape

SMALL = Shape(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)


def test_bf16_rounds_to_nearest_even_and_round_trips() -> None:
    values = np.array([1.0, -2.5, 3.140625, 1.00390625, 1.01171875, 65504.0], dtype=np.float32)
    bits = tiny_model.to_bf16_bits(values)
    assert list(tiny_model.from_bf16_bits(bits)) == [1.0, -2.5, 3.140625, 1.0, 1.015625, 65536.0]


def test_safetensors_header_offsets_and_data(tmp_path: Path) -> None:
    tensors = {"b": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.ones(4, dtype=np.float32)}
    path = tmp_path / "model.safetensors"
    tiny_model.write_safetensors(path, tensors)
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    assert length % 8 == 0
    header = json.loads(raw[8:8 + length])
    assert header["a"] == {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}
    assert header["b"] == {"dtype": "BF16", "shape": [2, 3], "data_offsets": [8, 20]}
    data = raw[8 + length:]
    assert len(data) == 20
    b = tiny_model.from_bf16_bits(np.frombuffer(data[8:20], dtype=np.uint16)).reshape(2, 3)
    assert b.tolist() == tensors["b"].tolist()


def test_weights_are_deterministic_and_a_noisier_drafter_agrees_less() -> None:
    first, again = tiny_model.random_weights(SMALL, 3), tiny_model.random_weights(SMALL, 3)
    assert all(np.array_equal(first[name], again[name]) for name in first)
    prompts = [[1, 5 + i, 9, 12 + i] for i in range(4)]
    paths = [(len(p), path) for p, path in zip(prompts, tiny_model.greedy_paths(first, SMALL, prompts, 8),
                                               strict=True)]
    rates = [tiny_model.agreement(paths, tiny_model.noisy_copy(first, scale, 1), SMALL) for scale in (0.0, 0.3, 2.0)]
    assert rates[0] == 1.0 and rates[0] >= rates[1] >= rates[2] and rates[2] < 0.5, rates
    # Special tokens never win: a greedy continuation never stops early.
    assert all(token >= len(tiny_model.SPECIAL_TOKENS) for _, path in paths for token in path[4:])


def test_calibration_finds_the_wanted_agreement() -> None:
    weights = tiny_model.random_weights(SMALL, 1)
    prompts = [[1, 7 + i, 20, 33 + i] for i in range(6)]
    paths = [(len(p), path) for p, path in zip(prompts, tiny_model.greedy_paths(weights, SMALL, prompts, 10),
                                               strict=True)]
    _, measured, _ = tiny_model.calibrate(weights, SMALL, paths, 0.5, seed=2, rounds=10)
    assert measured == pytest.approx(0.5, abs=0.1)


@pytest.mark.parametrize("value", ["poor", "poor=0", "poor=1.5", "=0.5", "a b=0.5"])
def test_a_bad_drafter_argument_is_refused(value: str) -> None:
    with pytest.raises(SystemExit, match="NAME=ACCEPTANCE"):
        tiny_model.parse_drafters([value])
