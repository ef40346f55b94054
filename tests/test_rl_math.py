"""GRPO / PPO maths against numbers worked out by hand."""

import math

import pytest
import torch

from worldloop.rl.advantages import (
    explained_variance,
    first_done_index,
    gae,
    grpo_advantages,
    informative_groups,
    loss_mask,
    sample_weights,
    shuffled_within_groups,
    trajectory_scores,
)
from worldloop.rl.losses import clipped_policy_loss, clipped_value_loss, entropy_bonus, kl_penalty

T, F = True, False


def test_first_done_and_mask_success_first_chunk_and_truncation():
    done = torch.tensor(
        [
            [T, T, T, T],  # success on the first chunk
            [F, F, T, T],  # success on the third
            [F, F, F, T],  # truncated at the last chunk
            [F, F, F, F],  # still running when the rollout stopped
        ]
    )
    assert first_done_index(done).tolist() == [0, 2, 3, 3]
    assert loss_mask(done).tolist() == [[T, F, F, F], [T, T, T, F], [T, T, T, T], [T, T, T, T]]
    assert loss_mask(done, mask_after_success=False).all()


def test_scores_count_rewards_up_to_the_first_done_only():
    rewards = torch.tensor([[5.0, 0.0, 5.0], [0.0, 0.0, 5.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[T, F, F], [T, T, T], [T, T, T]])
    assert trajectory_scores(rewards, mask).tolist() == [5.0, 5.0, 0.0]


def test_grpo_advantages_by_hand():
    # group 1: scores 5, 0, 0, 0: mean 1.25, unbiased std sqrt((3.75^2 + 3 * 1.25^2) / 3) = 2.5
    # group 2: all fail; group 3: all succeed -> advantage 0 and no signal
    scores = torch.tensor([5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 5.0, 5.0, 5.0])
    advantages = grpo_advantages(scores, 4)
    expected = [3.75 / (2.5 + 1e-6)] + [-1.25 / (2.5 + 1e-6)] * 3 + [0.0] * 8
    assert advantages.tolist() == pytest.approx(expected, abs=1e-6)
    assert informative_groups(scores, 4).tolist() == [T] * 4 + [F] * 8
    with pytest.raises(ValueError, match="groups of 5"):
        grpo_advantages(scores, 5)


def test_shuffled_scores_keep_each_groups_scores_and_cut_their_link_to_the_trajectories():
    scores = torch.tensor([0.0, 5.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0])  # three groups of 4
    draws = [shuffled_within_groups(scores, 4, torch.Generator().manual_seed(seed)) for seed in range(20)]
    for shuffled in draws:
        for g in range(3):  # the same scores in every group: mean, spread and informativeness unchanged
            assert sorted(shuffled[4 * g : 4 * g + 4].tolist()) == sorted(scores[4 * g : 4 * g + 4].tolist())
        assert torch.equal(informative_groups(shuffled, 4), informative_groups(scores, 4))
    assert torch.equal(draws[0], shuffled_within_groups(scores, 4, torch.Generator().manual_seed(0)))  # seeded: a resumed run draws the same
    moved = torch.stack([d != scores for d in draws]).float().mean(dim=0)
    assert moved[4:8].sum() == 0 and (moved[8:] > 0.5).all(), moved  # an all-equal group cannot change; 1,2,3,4 rarely stays put
    with pytest.raises(ValueError, match="groups of 4"):
        shuffled_within_groups(scores[:10], 4, torch.Generator())


def test_sample_weights_length_normalisation_by_hand():
    # Two kept trajectories of valid lengths 1 and 4, one dropped (no-signal group).
    mask = torch.tensor([[T, F, F, F], [T, T, T, T], [T, T, F, F]])
    keep = torch.tensor([T, T, F])
    weights = sample_weights(mask, keep)
    # each kept trajectory weighs 1/2 in total, spread over its own valid chunks
    assert weights.flatten().tolist() == pytest.approx([0.5, 0, 0, 0] + [0.125] * 4 + [0, 0, 0, 0])
    plain = sample_weights(mask, keep, length_normalise=False)
    assert plain.flatten().tolist() == pytest.approx([0.2, 0, 0, 0] + [0.2] * 4 + [0, 0, 0, 0])
    assert sample_weights(mask, torch.tensor([F, F, F])).sum() == 0


def test_clipped_policy_loss_asymmetric_clip_by_hand():
    # one token per chunk; ratios e^0.5 = 1.6487 (A = +1, clipped at 1.28), e^-0.5 = 0.6065 (A = -1, clipped at 0.8),
    # 1.1 (A = +2, inside), 0.7 (A = +1: below the low clip but the unclipped term wins for positive A)
    old = torch.zeros(4, 1, 1)
    new = torch.log(torch.tensor([math.exp(0.5), math.exp(-0.5), 1.1, 0.7])).view(4, 1, 1)
    advantages = torch.tensor([1.0, -1.0, 2.0, 1.0])
    weights = torch.full((4,), 0.25)
    loss, stats = clipped_policy_loss(new, old, advantages, weights, clip_low=0.2, clip_high=0.28)
    per_chunk = [-1.28, 0.8, -2.2, -0.7]  # max(-A r, -A clip(r))
    assert loss.item() == pytest.approx(sum(per_chunk) / 4, abs=1e-6)
    assert stats["clip_fraction"].item() == pytest.approx(3 / 4)
    k3 = [(r - 1) - math.log(r) for r in (math.exp(0.5), math.exp(-0.5), 1.1, 0.7)]
    assert stats["approx_kl"].item() == pytest.approx(sum(k3) / 4, abs=1e-6)


def test_gradient_flows_only_through_unclipped_tokens():
    new = torch.log(torch.tensor([1.5, 1.0])).view(2, 1, 1).requires_grad_(True)
    loss, _ = clipped_policy_loss(new, torch.zeros(2, 1, 1), torch.tensor([1.0, 1.0]), torch.tensor([0.5, 0.5]))
    loss.backward()
    # token 0 is above 1 + 0.28 with A > 0: no gradient; token 1: d(-0.5 r)/d log r = -0.5
    assert new.grad.flatten().tolist() == pytest.approx([0.0, -0.5])


def test_value_entropy_and_kl_terms_by_hand():
    values, old_values, returns = torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.0]), torch.tensor([0.0, 1.0])
    weights = torch.tensor([0.5, 0.5])
    # chunk 0: unclipped (1-0)^2 = 1, clipped 0.7^2 = 0.49 -> 0.5; chunk 1: both 1 -> 0.5
    assert clipped_value_loss(values, old_values, returns, weights, clip=0.2).item() == pytest.approx(0.5 * (0.5 * 1 + 0.5 * 1))
    values = torch.tensor([0.2, 0.0])  # chunk 0: unclipped 0.2^2 = 0.04; clipped to 1.0 - 0.2 = 0.8 -> 0.64
    old_values = torch.tensor([1.0, 0.0])  # the pessimistic (clipped) term wins
    assert clipped_value_loss(values, old_values, returns, weights, clip=0.2).item() == pytest.approx(0.5 * (0.5 * 0.64 + 0.5 * 1.0))
    entropy = torch.tensor([[[1.0, 3.0]], [[2.0, 2.0]]])
    assert entropy_bonus(entropy, torch.tensor([0.75, 0.25])).item() == pytest.approx(0.75 * 2 + 0.25 * 2)
    same = torch.randn(2, 1, 2)
    assert kl_penalty(same, same, weights).item() == pytest.approx(0.0)
    delta = math.log(2.0)  # reference twice as likely: e^d - d - 1 = 1 - ln 2
    assert kl_penalty(torch.zeros(1, 1, 1), torch.full((1, 1, 1), delta), torch.ones(1)).item() == pytest.approx(1 - delta)


def test_gae_by_hand_with_termination_and_bootstrap():
    gamma, lam = 0.5, 0.5
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    values = torch.tensor([[1.0, 2.0], [1.0, 2.0]])
    terminated = torch.tensor([[F, T], [F, F]])  # episode 0 succeeds at chunk 1; episode 1 is cut off
    last_values = torch.tensor([10.0, 4.0])
    advantages, returns = gae(rewards, values, terminated, terminated, last_values, gamma, lam)
    # ep 0: d1 = 1 - 2 = -1; d0 = 0 + 0.5*2 - 1 = 0; A0 = 0 + 0.25 * -1 = -0.25
    # ep 1: d1 = 0 + 0.5*4 - 2 = 0; d0 = 0; A = 0
    assert advantages.flatten().tolist() == pytest.approx([-0.25, -1.0, 0.0, 0.0])
    assert returns.flatten().tolist() == pytest.approx([0.75, 1.0, 1.0, 2.0])
    weights = torch.ones(2, 2)
    assert explained_variance(values, values, weights) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(2, 2), returns, weights) < 0.5


def test_gae_bootstraps_a_truncated_episode_from_its_last_step_and_takes_nothing_after():
    """Episode 0 is cut by its time limit at chunk 2 of 6 while episode 1 runs on: its advantages come
    from its own three chunks, bootstrapped from V of the observation after chunk 2 (values[0, 3])."""
    gamma, lam = 0.5, 0.5
    rewards = torch.tensor([[0.0, 0.0, 1.0, 5.0, 5.0, 5.0], [0.0] * 6])
    values = torch.tensor([[1.0, 1.0, 1.0, 2.0, 9.0, 9.0], [0.0] * 6])
    done = torch.tensor([[F, F, T, T, T, T], [F] * 6])
    terminated = torch.zeros(2, 6, dtype=torch.bool)
    last_values = torch.tensor([9.0, 0.0])
    advantages, returns = gae(rewards, values, done, terminated, last_values, gamma, lam)
    # d2 = 1 + 0.5 * 2 - 1 = 1; d1 = d0 = 0 + 0.5 * 1 - 1 = -0.5
    # A2 = 1; A1 = -0.5 + 0.25 * 1 = -0.25; A0 = -0.5 + 0.25 * -0.25 = -0.5625; nothing after chunk 2
    assert advantages[0].tolist() == pytest.approx([-0.5625, -0.25, 1.0, 0.0, 0.0, 0.0])
    assert returns[0, :3].tolist() == pytest.approx([0.4375, 0.75, 2.0])
    assert advantages[1].tolist() == pytest.approx([0.0] * 6)


def test_agreement_beyond_chance_by_hand():
    """Two tasks of 4 episodes: 5 of 8 verdicts agree; independent verdicts with the same per-task rates
    would agree 0.5 (task a) and 0.375 (task b) of the time, so kappa = (0.625 - 0.4375) / 0.5625."""
    from worldloop.utils.stats import agreement_beyond_chance

    real = [1, 1, 0, 0, 1, 0, 0, 0]
    imagined = [1, 0, 0, 0, 1, 1, 1, 0]
    result = agreement_beyond_chance(real, imagined, ["a"] * 4 + ["b"] * 4)
    assert result["agreement"] == 0.625 and result["chance"] == pytest.approx(0.4375)
    assert result["kappa"] == pytest.approx(1 / 3)
    assert result["kappa_stderr"] == pytest.approx(math.sqrt(0.625 * 0.375 / 8) / 0.5625)
    assert agreement_beyond_chance(real, real, ["a"] * 8)["kappa"] == 1.0
    # A verdict that knows only each task's rate (constant within a task) agrees often, by chance alone.
    knows_the_rate = agreement_beyond_chance([1, 1, 1, 0, 0, 0, 0, 1], [1, 1, 1, 1, 0, 0, 0, 0], ["a"] * 4 + ["b"] * 4)
    assert knows_the_rate["agreement"] == 0.75 and knows_the_rate["kappa"] == pytest.approx(0.0)
    assert agreement_beyond_chance([0, 0], [0, 0], ["a", "a"])["kappa"] is None  # chance is 1: undefined
    with pytest.raises(ValueError, match="a stratum for every episode"):
        agreement_beyond_chance([1, 0], [1], ["a", "a"])


def test_a_kappa_that_rounds_to_zero_prints_without_a_sign():
    from worldloop.utils.stats import fixed, format_kappa

    assert format_kappa(-0.001, 0.0612) == "0.00 ± 0.06" and format_kappa(-0.02, 0.09) == "-0.02 ± 0.09"
    assert [fixed(v) for v in (-0.004, -0.005001, 0.0, -0.0, 1.0)] == ["0.00", "-0.01", "0.00", "0.00", "1.00"]
    assert fixed(-0.0004, 3) == "0.000" and fixed(-12.5, 1) == "-12.5"


def test_paired_difference_by_hand():
    """Changes 0,0,+1,+1,0,-1,0,0,0,0: mean 0.1, sample variance 2.9 / 9, SE sqrt(2.9 / 90); 2 gained, 1 lost."""
    from worldloop.utils.stats import format_paired, paired_difference

    change = paired_difference([1, 1, 0, 0, 0, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0, 0, 0])
    assert change["difference"] == pytest.approx(0.1) and change["stderr"] == pytest.approx(math.sqrt(2.9 / 90))
    assert (change["gained"], change["lost"], change["episodes"]) == (2, 1, 10)
    assert format_paired(change) == "+0.100 (paired SE 0.180, +0.6 SE; 2 gained, 1 lost)"
    assert format_paired(paired_difference([1, 0], [1, 0])) == "+0.000 (no episode changed)"
    with pytest.raises(ValueError, match="two outcomes"):
        paired_difference([1, 0], [1])


def test_paired_changes_split_the_task_major_episodes_and_tighten_the_fall():
    """RL's evaluations repeat the same initial states: the paired change per task reads the verdict strings in the
    check's task-major order; a fall where few episodes flipped is significant paired and not unpaired."""
    from worldloop.rl.summary import paired_changes
    from worldloop.diagnostics.warnings import real_success_fall
    from worldloop.rl.summary import paired_change_rows

    def check(real: str, imagined: str, tasks=("a", "b")) -> dict:
        size = len(real) // len(tasks)
        per_task = {t: {"success_once": real[i * size : (i + 1) * size].count("1") / size, "stderr": 0.0, "episodes": size} for i, t in enumerate(tasks)}
        return {"iteration": 0, "real": {"success_once": real.count("1") / len(real), "stderr": 0.0, "episodes": len(real), "per_task": per_task},
                "per_episode": {"real": real, "imagined": imagined}}  # fmt: skip

    first, later = check("100000", "000000"), check("111001", "000100")
    real = paired_changes(first, later)
    assert real["difference"] == pytest.approx(3 / 6) and real["per_task"]["a"]["difference"] == pytest.approx(2 / 3)
    assert real["per_task"]["b"]["difference"] == pytest.approx(1 / 3) and real["per_task"]["b"]["gained"] == 1
    assert paired_changes(first, later, "imagined")["per_task"]["b"]["difference"] == pytest.approx(1 / 3)
    assert paired_changes({"real": first["real"]}, later) is None  # no per-episode verdicts kept: unpaired only
    assert paired_changes(first, check("111001", "000100", tasks=("b", "a"))) is None  # other episodes in the same places
    assert paired_changes(first, check("111001", "000100", tasks=("a", "b", "c"))) is None
    rows = paired_change_rows([first, later | {"iteration": 9}])
    assert "Change from iteration 0 to 9" in rows[1] and rows[-2].startswith("| a | +0.667") and rows[-1].startswith("| b | +0.333")

    # 100 episodes at 0.50; 10 of them fail later, none gains: -0.10, unpaired 0.10 / hypot(0.050, 0.049) = 1.4 SE,
    # paired 0.1 / sqrt((10 * 0.81 + 90 * 0.01) / 99 / 100) = 3.3 SE
    def rates(real: str) -> dict:
        p = real.count("1") / len(real)
        summary = {"success_once": p, "stderr": math.sqrt(p * (1 - p) / len(real)), "episodes": len(real)}
        return {"real": summary | {"per_task": {"a": dict(summary)}}, "per_episode": {"real": real}}

    before, after = rates("1" * 50 + "0" * 50), rates("1" * 40 + "0" * 60)
    assert real_success_fall(before, after, 3.0) == ["overall 0.500 -> 0.400 (-3.3 paired SE)", "a 0.500 -> 0.400 (-3.3 paired SE)"]
    unpaired = [{key: value for key, value in result.items() if key != "per_episode"} for result in (before, after)]
    assert real_success_fall(*unpaired, 3.0) == [] and real_success_fall(*unpaired, 1.0) == ["overall 0.500 -> 0.400 (-1.4 SE)", "a 0.500 -> 0.400 (-1.4 SE)"]
