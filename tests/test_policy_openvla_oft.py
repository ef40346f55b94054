"""OpenVLA-OFT: a tiny random checkpoint in the published layout loads, acts, scores, trains, runs GRPO
through `worldloop rl`, exports merged LoRA weights, and a damaged one is refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from _oft_fixtures import ACTION_DIM, CHUNK, FRAME, Q01, Q99, SUITE, write_tiny_checkpoint
from worldloop.policies import load_policy
from worldloop.policies.openvla_oft.modeling import OpenVLAOFT

INSTRUCTIONS = ["reach the goal position", "push the puck to a goal", "press the button top down"]  # prompts of three lengths


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("oft") / "openvla-7b-oft-tiny")


@pytest.fixture
def policy(checkpoint):
    torch.manual_seed(0)
    return load_policy(f"openvla-oft:{checkpoint}")


def frames(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (batch, FRAME, FRAME, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_the_published_layout_loads_with_its_key_names(checkpoint, policy):
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index.values()) == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    for key in ("vision_backbone.featurizer.blocks.0.ls1.scale_factor", "vision_backbone.featurizer.reg_token",
                "vision_backbone.fused_featurizer.attn_pool.latent", "projector.fc1.weight", "projector.fc3.bias",
                "language_model.model.layers.1.self_attn.q_proj.weight", "language_model.model.layers.0.mlp.down_proj.weight",
                "language_model.model.embed_tokens.weight", "language_model.lm_head.weight"):  # fmt: skip
        assert key in index, key
    assert isinstance(policy, OpenVLAOFT) and policy.statistics.suite == SUITE
    assert (policy.chunk_size, policy.action_dim, policy.image_size, policy.num_bins) == (CHUNK, ACTION_DIM, FRAME, 256)
    assert policy.action_head is not None and policy.proprio_projector is None
    saved = load_file(str(checkpoint / "model-00001-of-00002.safetensors"))
    name = next(k for k in saved if k.endswith("ls1.scale_factor"))
    module_name = name.removesuffix("scale_factor") + "gamma"
    assert torch.equal(dict(policy.vla.named_parameters())[module_name], saved[name])  # Prismatic's scale_factor is timm's gamma
    # the action tokens are the last 256 ids of the unpadded vocabulary (320 here; 32000 for Llama-2)
    assert policy.bin_token_ids[0].item() == 319 and policy.bin_token_ids[-1].item() == 64


def test_actions_are_unnormalised_with_the_suites_q01_q99_bounds(policy):
    """Greedy with the L1 head: a head that outputs constants gives hand-computed actions and bins;
    sampled bins decode to their bin centres, un-normalised by hand."""
    with torch.no_grad():
        policy.action_head.model.fc2.weight.zero_()
        policy.action_head.model.fc2.bias.copy_(torch.tensor([-1.0, 0.5, 0.25, 0.7]))
    out = policy.act(frames(2), INSTRUCTIONS[:2], greedy=True)
    # masked dims: 0.5 (a + 1)(q99 - q01) + q01 with [q01, q99] = [-0.5, 0.5], [-1, 1], [0, 2]; the last passes through
    expected = torch.tensor([-0.5, 0.5, 1.25, 0.7])
    assert torch.allclose(out.actions, expected.expand(2, CHUNK, 4), atol=1e-6)
    assert out.tokens[0, 0].tolist() == [0, 191, 159, 216]  # floor((a + 1) * 255 / 2)

    sampled = policy.act(frames(2), INSTRUCTIONS[:2], generator=torch.Generator().manual_seed(0))
    b = sampled.tokens[0, 0].tolist()
    centre = [-1 + (min(x, 254) + 0.5) * 2 / 255 for x in b]
    by_hand = [0.5 * (centre[d] + 1) * (Q99[d] - Q01[d]) + Q01[d] for d in range(3)] + [centre[3]]
    assert torch.allclose(sampled.actions[0, 0], torch.tensor(by_hand), atol=1e-5)
    assert sampled.actions.shape == (2, CHUNK, ACTION_DIM) and (sampled.log_probs <= 0).all()


def test_chunk_log_probs_equal_a_token_by_token_computation(policy):
    """One batched pass over prompts of different lengths gives each token the log-prob that one sample alone,
    one token at a time, read from the full LM head's logits renormalised over the action tokens, gives."""
    images = frames(3, seed=1)
    out = policy.act(images, INSTRUCTIONS, generator=torch.Generator().manual_seed(1))
    scored = policy.evaluate(images, INSTRUCTIONS, out.tokens)
    assert torch.allclose(scored.log_probs, out.log_probs, atol=1e-5)

    language_model, num_actions = policy.vla.language_model, CHUNK * ACTION_DIM
    with torch.no_grad():
        for i, text in enumerate(INSTRUCTIONS):
            embeddings, _, _ = policy.sequence(images[i : i + 1], [text])  # one sample: no padding
            length = embeddings.shape[1]
            mask = torch.ones(length, length).tril().bool()
            mask[-num_actions - 1 :, -num_actions - 1 :] = True  # the action block (and </s>) attend both ways
            logits = language_model(inputs_embeds=embeddings, attention_mask=mask[None, None]).logits[0]  # (S, vocab)
            for j in range(num_actions):
                position = length - num_actions - 2 + j  # the position before action j
                action_logits = logits[position, policy.config.vocab_size - 256 : policy.config.vocab_size].flip(0)  # bin b = id vocab-1-b
                k, a = divmod(j, ACTION_DIM)
                expected = torch.log_softmax(action_logits, -1)[out.tokens[i, k, a]]
                assert torch.isclose(out.log_probs[i, k, a], expected, atol=1e-4), (i, j)
    chunk = out.log_probs.sum((1, 2))
    assert torch.allclose(chunk, scored.log_probs.sum((1, 2)), atol=1e-4)


def test_an_sft_step_lowers_the_loss_and_the_merged_export_acts_the_same(policy, tmp_path):
    images, texts = frames(4, seed=2), [INSTRUCTIONS[i % 3] for i in range(4)]
    actions = torch.rand(4, CHUNK, ACTION_DIM) * torch.tensor([1.0, 2.0, 2.0, 1.0]) + torch.tensor(Q01)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    lora = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_B" in n}
    assert lora and all(not p.requires_grad for n, p in policy.named_parameters() if "featurizer" in n and "lora" not in n)
    optimizer = torch.optim.AdamW(trainable, lr=3e-3)
    policy.train()
    first = None
    for _ in range(8):
        losses = policy.sft_loss(images, texts, actions)
        first = first if first is not None else {k: v.item() for k, v in losses.items()}
        optimizer.zero_grad()
        losses["loss"].backward()
        optimizer.step()
    policy.eval()
    last = policy.sft_loss(images, texts, actions)
    assert last["l1_loss"].item() < first["l1_loss"] and last["token_loss"].item() < first["token_loss"]
    assert any(not torch.equal(p, lora[n]) for n, p in policy.named_parameters() if n in lora)

    policy.save_pretrained(tmp_path / "merged", shards=2)
    merged = OpenVLAOFT.from_pretrained(tmp_path / "merged", lora=False)
    written = json.loads((tmp_path / "merged" / "model.safetensors.index.json").read_text())["weight_map"]
    published = json.loads((Path(policy.source) / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(written) == set(published)  # the same key names as the checkpoint it came from
    assert len(set(written.values())) == 2 and not any("lora" in key or "base_layer" in key for key in written)
    assert (tmp_path / "merged" / "action_head--100_checkpoint.pt").is_file() and (tmp_path / "merged" / "tokenizer.json").is_file()
    with torch.no_grad():
        assert torch.allclose(merged.chunk(images, texts).logits, policy.chunk(images, texts).logits, atol=1e-4)
        assert torch.allclose(merged.act(images, texts, greedy=True).actions, policy.act(images, texts, greedy=True).actions, atol=1e-5)
    assert load_policy(tmp_path / "merged").statistics.suite == SUITE  # a saved folder loads by its model_type alone


def test_grpo_through_the_rl_command_on_the_tiny_checkpoint(checkpoint, tmp_path):
    from worldloop.cli import main

    out = tmp_path / "rl"
    code = main(["rl", "--preset", "micro", "--env", "real", "--policy", f"openvla-oft:{checkpoint}", "--out", str(out), "--no-progress",
                 "rl.iterations=1", "rl.checks.episodes_per_task=0", "rl.filter_groups=false", "rl.entropy_coef=0.01",
                 "sim.max_steps=16", "sim.num_workers=1"])  # fmt: skip
    assert code == 0
    history = json.loads((out / "results.json").read_text())["history"]
    assert history[0]["actor/update_steps"] >= 1 and history[0]["actor/entropy"] > 0
    before = load_file(str(checkpoint / "model-00001-of-00002.safetensors")) | load_file(str(checkpoint / "model-00002-of-00002.safetensors"))
    after = OpenVLAOFT.from_pretrained(out / "policy", lora=False).merged_vla_tensors()
    changed = [k for k in before if "q_proj" in k and not torch.equal(before[k], after[k])]
    assert changed, "the GRPO step left every LoRA-adapted weight as it was"


def test_a_proprio_checkpoint_needs_the_state(tmp_path):
    folder = write_tiny_checkpoint(tmp_path / "proprio", proprio_dim=3)
    policy = OpenVLAOFT.from_pretrained(folder, lora=False)
    assert policy.proprio_projector is not None and policy.files["proprio_projector"] == "proprio_projector--100_checkpoint.pt"
    with pytest.raises(ValueError, match="proprio projector: it needs the robot state"):
        policy.act(frames(1), INSTRUCTIONS[:1])
    a = policy.act(frames(1), INSTRUCTIONS[:1], greedy=True, proprio=torch.zeros(1, 3)).actions
    b = policy.act(frames(1), INSTRUCTIONS[:1], greedy=True, proprio=torch.ones(1, 3)).actions
    assert not torch.allclose(a, b)


def damaged_copy(checkpoint, tmp_path, name="damaged"):
    folder = tmp_path / name
    shutil.copytree(checkpoint, folder)
    return folder


def test_a_damaged_checkpoint_is_refused_by_name(checkpoint, tmp_path):
    missing = damaged_copy(checkpoint, tmp_path, "missing")
    (missing / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors is missing"):
        OpenVLAOFT.from_pretrained(missing, lora=False)

    renamed = damaged_copy(checkpoint, tmp_path, "renamed")  # renamed in the shard and the index alike
    shard = renamed / "model-00001-of-00002.safetensors"
    tensors = load_file(str(shard))
    key = "projector.fc2.weight" if "projector.fc2.weight" in tensors else next(iter(tensors))
    tensors["projector.fc2.weights"] = tensors.pop(key)
    save_file(tensors, str(shard))
    index_path = renamed / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["projector.fc2.weights"] = index["weight_map"].pop(key)
    index_path.write_text(json.dumps(index))
    with pytest.raises(ValueError, match=f"has no tensor '{key}' that the model needs"):
        OpenVLAOFT.from_pretrained(renamed, lora=False)

    unlisted = damaged_copy(checkpoint, tmp_path, "unlisted")  # renamed in the shard only
    shutil.copy(shard, unlisted / "model-00001-of-00002.safetensors")
    with pytest.raises(ValueError, match=f"puts '{key}' in .*model-00001-of-00002.safetensors, which does not hold it"):
        OpenVLAOFT.from_pretrained(unlisted, lora=False)

    truncated = damaged_copy(checkpoint, tmp_path, "truncated")
    path = truncated / "model-00002-of-00002.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match="model-00002-of-00002.safetensors cannot be read .*truncated"):
        OpenVLAOFT.from_pretrained(truncated, lora=False)

    head = damaged_copy(checkpoint, tmp_path, "head")
    path = head / "action_head--100_checkpoint.pt"
    state = torch.load(path, weights_only=True)
    state["module.model.extra.weight"] = torch.zeros(1)
    torch.save(state, path)
    with pytest.raises(ValueError, match="action_head--100_checkpoint.pt holds an unexpected tensor 'model.extra.weight'"):
        OpenVLAOFT.from_pretrained(head, lora=False)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match="action_head--100_checkpoint.pt cannot be read"):
        OpenVLAOFT.from_pretrained(head, lora=False)


def test_statistics_and_config_errors_name_the_file(checkpoint, tmp_path):
    two = damaged_copy(checkpoint, tmp_path, "two-suites")
    stats = json.loads((two / "dataset_statistics.json").read_text())
    stats["other_suite"] = stats[SUITE]
    (two / "dataset_statistics.json").write_text(json.dumps(stats))
    with pytest.raises(ValueError, match="holds 2 suites .*openvla-oft:DIR@SUITE"):
        OpenVLAOFT.from_pretrained(two, lora=False)
    assert OpenVLAOFT.from_pretrained(f"{two}@other_suite", lora=False).statistics.suite == "other_suite"
    with pytest.raises(ValueError, match="has no suite 'nope'"):
        OpenVLAOFT.from_pretrained(f"{two}@nope", lora=False)
    config = json.loads((two / "config.json").read_text())
    config["worldloop"]["chunk"] = 4
    (two / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="unknown key 'chunk' in the worldloop block"):
        OpenVLAOFT.from_pretrained(f"{two}@other_suite", lora=False)


def test_bench_vla_measures_act_and_the_grpo_update_with_and_without_lora_and_checkpointing(tmp_path):
    from worldloop.cli import main

    out = tmp_path / "bench.txt"
    assert main(["bench", "vla", "--models", "tiny", "--batch-sizes", "2", "--steps", "1", "--out", str(out), "rl.num_minibatches=4"]) == 0
    text = out.read_text()
    assert "| act | 2 |" in text and "K=8, A=7" in text
    rows = [line for line in text.splitlines() if line.startswith("| GRPO update |")]
    assert len(rows) == 4 and all(float(row.split("|")[5]) > 0 for row in rows)
    assert [row.split("|")[3].strip().startswith("rank 32") for row in rows] == [False, False, True, True]
    assert [row.split("|")[4].strip() for row in rows] == ["no", "yes", "no", "yes"]


def test_sft_fine_tunes_a_checkpoint_to_the_datasets_action_space(checkpoint, tiny_dataset, tmp_path):
    """`worldloop sft --policy openvla-oft:DIR`: the dataset's own bounds replace the suite's, and the folder it
    writes (published layout) loads and acts in them."""
    from worldloop.cli import main
    from worldloop.data.dataset import TrajectoryDataset

    out = tmp_path / "sft"
    code = main(["sft", "--preset", "micro", "--policy", f"openvla-oft:{checkpoint}", "--dataset", str(tiny_dataset), "--out", str(out),
                 "sft.steps=3", "sft.batch_size=4", "sft.lr=0.001"])  # fmt: skip
    assert code == 0 and (out / "model.safetensors.index.json").is_file() and (out / "tb").is_dir()
    tuned = load_policy(out)
    actions = torch.cat([torch.tensor(np.array(TrajectoryDataset(tiny_dataset).episode(i).actions)) for i in range(4)])
    assert tuned.statistics.suite == tiny_dataset.name and tuned.statistics.mask.all()
    assert torch.all(tuned.statistics.q01 >= actions.min(0).values - 1e-6) and torch.all(tuned.statistics.q99 <= actions.max(0).values + 1e-6)
    acted = tuned.act(frames(2), INSTRUCTIONS[:2]).actions
    assert torch.all(acted >= tuned.statistics.q01 - 1e-5) and torch.all(acted <= tuned.statistics.q99 + 1e-5)


def test_another_action_dimension_gets_a_fresh_l1_head(policy):
    from worldloop.policies.openvla_oft.configuration import ActionStatistics

    seven = ActionStatistics(-torch.ones(7), torch.ones(7), torch.ones(7, dtype=torch.bool), "libero_like")
    policy.use_statistics(seven)
    assert policy.action_dim == 7 and policy.action_head.model.fc2.out_features == 7 and policy.action_head.model.fc1.in_features == 7 * 32
    out = policy.act(frames(2), INSTRUCTIONS[:2], greedy=True)
    assert out.actions.shape == (2, CHUNK, 7) and out.tokens.shape == (2, CHUNK, 7)


def test_a_published_text_config_lists_only_what_differs_from_llama2_7b():
    """Hugging Face writes a config's differences from LlamaConfig's defaults: openvla-7b's text_config holds
    little more than the padded vocabulary; the rest is Llama-2 7B."""
    from _oft_fixtures import raw_config
    from worldloop.policies.openvla_oft.configuration import OpenVLAOFTConfig

    raw = raw_config()
    raw["text_config"] = {"model_type": "llama", "pad_token_id": 32000, "torch_dtype": "bfloat16", "vocab_size": 32064}
    raw.pop("worldloop")
    config = OpenVLAOFTConfig.from_json(raw)
    assert (config.hidden_size, config.text_config["num_hidden_layers"], config.text_config["intermediate_size"]) == (4096, 32, 11008)
    assert config.vocab_size == 32000 and config.chunk_size == 8 and config.lora_rank == 32 and config.input_size == 32
