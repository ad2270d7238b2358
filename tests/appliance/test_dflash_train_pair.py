"""The rig's trainer (tests/gpu/realengine/train_pair.py) on the CPU, tiny: its masked training
forward of the DFlash drafter gives the same logits as the serving-time forward (one block at a
time, as 433c58ed7's DFlashWorkerV2 runs it), and a few steps of each training loop lower the
loss. Runs in CI (torch CPU only; no GPU, tokenizers or safetensors needed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

TRAINER = Path(__file__).resolve().parents[1] / "gpu" / "realengine" / "train_pair.py"


@pytest.fixture(scope="module")
def tp():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("train_pair", TRAINER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_pair"] = module
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is fastest on a shared CI machine
    yield module
    torch.set_num_threads(threads)


def tiny(tp):  # type: ignore[no-untyped-def]
    shape = tp.TargetShape(layers=4, hidden=32, heads=4, kv_heads=2, head_dim=8, inner=64,
                           vocab=tp.BYTE_OFFSET + 256)
    dshape = tp.DrafterShape(layers=2, block=4, target_layer_ids=(0, 2), heads=4, kv_heads=2,
                             head_dim=8, inner=64)
    torch.manual_seed(0)
    target = tp.Target(shape)
    tp._init(target, 1)
    drafter = tp.Drafter(dshape, target)
    tp._init(drafter, 2)
    # Norm weights away from 1, so a norm applied to the wrong tensor shows.
    with torch.no_grad():
        for model in (target, drafter):
            for param in model.parameters():
                if param.dim() == 1:
                    param.uniform_(0.5, 1.5)
    return target, drafter


def test_masked_training_forward_equals_serving_forward(tp) -> None:  # type: ignore[no-untyped-def]
    target, drafter = tiny(tp)
    torch.manual_seed(3)
    tokens = torch.randint(tp.BYTE_OFFSET, tp.BYTE_OFFSET + 256, (2, 24))
    feats = tp.features_of(target, tokens, drafter.shape.target_layer_ids)
    assert feats.shape == (2, 24, 2 * 32)
    # Overlapping blocks, an anchor at 0 (no context), anchors out of order in row 1.
    anchors = torch.tensor([[0, 5, 6, 19], [17, 2, 9, 11]])
    with torch.no_grad():
        packed = drafter.train_forward(feats, tokens, anchors)
        for row in range(2):
            for j, anchor in enumerate(anchors[row].tolist()):
                served = drafter.serve_forward(feats[row], int(tokens[row, anchor]), anchor)
                torch.testing.assert_close(packed[row, j], served, rtol=1e-5, atol=1e-5)
    # The check can fail: a block that saw its own anchor's context row differs.
    with torch.no_grad():
        leaky = drafter.serve_forward(feats[0], int(tokens[0, 6]), 7)
    assert not torch.allclose(packed[0, 2], leaky, atol=1e-3)


def test_features_are_the_residual_after_each_captured_layer(tp) -> None:  # type: ignore[no-untyped-def]
    target, _ = tiny(tp)
    tokens = torch.randint(tp.BYTE_OFFSET, tp.BYTE_OFFSET + 256, (1, 10))
    with torch.no_grad():
        _, every = target(tokens, capture=tuple(range(4)))
        logits, _ = target(tokens)
        # The last layer's residual, normed and through the head, is the logits.
        head = target.lm_head(tp.rms_norm(every[-1], target.norm, target.shape.eps))
    torch.testing.assert_close(head, logits)
    assert not torch.allclose(every[0], every[2])


def test_greedy_with_cache_equals_full_forward(tp) -> None:  # type: ignore[no-untyped-def]
    target, _ = tiny(tp)
    prompts = torch.randint(tp.BYTE_OFFSET, tp.BYTE_OFFSET + 256, (3, 6))
    out = tp.greedy(target, prompts, 5)
    with torch.no_grad():
        logits, _ = target(out)
    assert torch.equal(out[:, 6:], logits[:, 5:-1].argmax(-1))


def test_a_few_steps_train_both(tp) -> None:  # type: ignore[no-untyped-def]
    target, drafter = tiny(tp)
    budget = tp.Budget(seq=16, target_batch=8, drafter_batch=4, anchors=3, target_lr=3e-3,
                       drafter_lr=3e-3, drafter_steps=30)
    text = b"def add(a, b):\n    return a + b\n" * 40
    data = torch.tensor(tp.encode(text), dtype=torch.int16)
    log: list[str] = []
    result = tp.train_target(target, data, data[:200], 30, budget, 60.0, 5, log)
    assert result["steps"] == 29 and result["valid_loss"] < result["loss_every_50"][0]
    sequences = tp.greedy(target, data[:8].long().view(2, 4), 12)
    result = tp.train_drafter(drafter, target, sequences, 4, budget, 60.0, log)
    assert result["steps"] == 29
    with torch.no_grad():
        assert tp.offline_accept(drafter, target, sequences, 4) >= 1.0


def test_block_loss_weights_and_accept_length(tp) -> None:  # type: ignore[no-untyped-def]
    tokens = torch.tensor([[5, 6, 7, 8, 9, 10]])
    anchors = torch.tensor([[1]])
    logits = torch.full((1, 1, 4, 12), -10.0)
    logits[0, 0, 1, 7] = logits[0, 0, 2, 8] = logits[0, 0, 3, 0] = 10.0  # right, right, wrong
    assert tp.accept_lengths(logits, tokens, anchors).tolist() == [[3]]
    loss, top1 = tp.block_loss(logits, tokens, anchors, 4.0)
    assert top1.item() == 1.0 and loss.item() > 1.0
    assert tp.distinct_4grams([[1, 2, 3, 4, 1, 2, 3, 4]]) == pytest.approx(4 / 5)
    assert tp.decode(tp.encode("é\n".encode())) == "é\n".encode()


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "real-engine" / "433c58ed7"


def recorded(run: str) -> dict[int, dict]:  # type: ignore[type-arg]
    import json

    levels = json.loads((FIXTURES / run / "bench.json").read_text())
    return {level["concurrency"]: level["json"]["levels"][0] for level in levels}


def test_the_recorded_trained_pair_pays_at_concurrency_1_and_the_wrong_pair_accepts_nothing() -> None:
    """What the fixtures README says of the trained pair's recordings: a speculative mode reaches
    1.3x no speculation at concurrency 1 with an accept length of at least 2; the drafter on
    the other target accepts about nothing."""
    base = recorded("trained_base")
    speedups = {}
    for run in ("trained_dflash", "trained_ddtree_b8", "trained_ddtree_b16", "trained_ddtree_b32"):
        levels = recorded(run)
        assert set(levels) == {1, 4, 16, 32} and all(lv["errors"] == 0 for lv in levels.values())
        assert all(lv["accept_len"] >= 2 for lv in levels.values())
        speedups[run] = levels[1]["output_throughput"] / base[1]["output_throughput"]
    assert max(speedups.values()) >= 1.3 and speedups["trained_dflash"] == pytest.approx(1.57, abs=0.01)
    wrong = recorded("trained_wrong")
    assert all(lv["accept_len"] < 1.1 for lv in wrong.values())
