"""The imagined environment on the toy world: shapes, group sharing, reward, termination, KIR ratio, bad input."""

import pytest
import torch

from worldloop.envs.imagined import ImaginedEnv, InitialStates
from worldloop.envs.protocol import VecEnv
from worldloop.envs.toy import TARGETS, ToyEnv, ToyJudge, ToyWorldModel, instruction, render

K = 4


def make_pool(num_first: int = 6, num_keyframes: int = 3) -> InitialStates:
    """First frames of toy episodes plus 'keyframes' (mid-episode states with their memory)."""
    env = ToyEnv(num_first)
    first = env.reset([0] * num_first, list(range(num_first)))
    pool = InitialStates.from_first_frames(first.frames, first.instructions)
    target = torch.tensor(TARGETS["reach-top-right"])
    dots = torch.tensor([[0.3, 0.7], [0.5, 0.5], [0.2, 0.4]])[:num_keyframes]
    path = dots[:, None] + torch.linspace(-0.1, 0, 5)[None, :, None]  # 4 memory frames then the keyframe
    frames = render(path, target.expand(num_keyframes, 5, 2), 32)
    keyframes = InitialStates(
        anchors=pool.anchors[:num_keyframes],
        memory=frames[:, :4],
        current=frames[:, 4],
        instructions=[instruction("reach-top-right")] * num_keyframes,
        is_keyframe=torch.ones(num_keyframes, dtype=torch.bool),
        memory_actions=torch.zeros(num_keyframes, 4, 2),
    )
    return InitialStates.concat(pool, keyframes)


def make_env(num_envs=8, group_size=4, kir_ratio=0.5, max_steps=16) -> ImaginedEnv:
    return ImaginedEnv(ToyWorldModel(), ToyJudge(), make_pool(), num_envs, group_size, max_steps, reward_scale=5.0, kir_ratio=kir_ratio)


def test_shapes_and_groups_share_their_initial_state():
    env = make_env()
    assert isinstance(env, VecEnv)
    first = env.reset([0] * 8, [0] * 4 + [1] * 4)
    assert first.frames.shape == (8, 32, 32, 3) and first.frames.dtype == torch.uint8
    for group in (first.frames[:4], first.frames[4:]):
        assert (group == group[:1]).all()
    step = env.step(torch.zeros(8, K, 2))
    assert step.frames.shape == (8, K, 32, 32, 3) and step.frames.dtype == torch.uint8
    assert step.success.shape == (8, K) and step.done.shape == (8, K)
    assert step.reward.shape == (8,) and step.truncated.shape == (8,)
    assert env.elapsed_steps.tolist() == [K] * 8
    # Different seeds draw different states for different groups (over a few draws).
    draws = {tuple(env.reset([0] * 8, [s] * 8).frames[0].flatten()[:2000].tolist()) for s in range(6)}
    assert len(draws) > 1
    with pytest.raises(ValueError, match="share a task"):
        ImaginedEnv(ToyWorldModel(), ToyJudge(), make_pool().concat(make_pool(), _other_task_pool()), 8, 4).reset([0] * 3 + [1] * 5, [0] * 8)


def _other_task_pool() -> InitialStates:
    env = ToyEnv(2, tasks=("reach-bottom-left",))
    first = env.reset([0, 0], [5, 6])
    return InitialStates.from_first_frames(first.frames, first.instructions)


def test_kir_ratio_controls_keyframe_starts():
    for ratio, expected in ((0.0, 0.0), (1.0, 1.0)):
        env = make_env(num_envs=16, group_size=2, kir_ratio=ratio)
        env.reset([0] * 16, [s // 2 for s in range(16)])
        assert env.started_from_keyframe.float().mean().item() == expected
    env = make_env(num_envs=64, group_size=2, kir_ratio=0.5)
    env.reset([0] * 64, [s // 2 for s in range(64)])
    assert 0.2 < env.started_from_keyframe.float().mean().item() < 0.8
    # A keyframe start shows the keyframe, not the episode's first frame.
    env = make_env(num_envs=2, group_size=2, kir_ratio=1.0)
    start = env.reset([0, 0], [3, 3])
    keyframes = make_pool().current[make_pool().is_keyframe]
    assert any((start.frames[0] == k).all() for k in keyframes)


def test_reward_termination_truncation_and_per_env_counters():
    env = make_env(num_envs=2, group_size=2, kir_ratio=0.0, max_steps=16)
    start = render(torch.tensor([[0.43, 0.57]] * 2), torch.tensor([TARGETS["reach-top-right"]] * 2), 32)
    env.reset_to(start, [instruction("reach-top-right")] * 2)
    # env 0 heads for the target (top right; 0.04 per action, there after 2 chunks), env 1 away from it
    towards = torch.tensor([0.5, -0.5]).expand(K, 2)
    chunk = torch.stack([towards, -towards])
    rewards, dones, successes = [], [], []
    for _ in range(4):
        step = env.step(chunk)
        rewards.append(step.reward.tolist())
        dones.append(step.done[:, -1].tolist())
        successes.append(step.success.any(dim=1).tolist())
        if step.done[0, -1] and not step.done[1, -1]:
            frozen_at = env.elapsed_steps[0].item()
    success_chunk = [s[0] for s in successes].index(True)
    assert success_chunk == 1
    assert rewards[success_chunk][0] == 5.0 and sum(r[0] for r in rewards) == 5.0  # r = c (R_t - R_{t-1}), once
    assert all(dones[t][0] for t in range(success_chunk, 4))
    assert env.elapsed_steps.tolist() == [K * (success_chunk + 1), 16] and frozen_at == K * (success_chunk + 1)
    assert not any(s[1] for s in successes) and [d[1] for d in dones] == [False, False, False, True]
    assert step.truncated.tolist() == [False, True] and sum(r[1] for r in rewards) == 0.0
    # A finished episode repeats its last frame.
    assert (step.frames[0] == step.frames[0, :1]).all()


class ScriptedJudge:
    """Says success per env and chunk as scripted: verdicts (chunks, N)."""

    window, threshold, image_size = 1, 0.5, 32

    def __init__(self, verdicts: list[list[bool]]):
        self.verdicts, self.calls = torch.tensor(verdicts), 0
        self.task_thresholds: dict[str, float] = {}

    def score(self, windows: torch.Tensor, instructions: list[str]) -> torch.Tensor:
        self.calls += 1
        return self.verdicts[self.calls - 1].float()

    def probability(self, scores: torch.Tensor) -> torch.Tensor:
        return scores


def test_streak_score_is_the_highest_threshold_at_which_the_verdicts_pass():
    """Per episode, the highest threshold at which ChunkVerdicts (success_chunks in a row) still calls it
    a success: calibrating a threshold on replays needs only these scores."""
    from worldloop.envs.judging import ChunkVerdicts, streak_score

    probability = torch.tensor([[0.2, 0.9, 0.7, 0.1], [0.8, 0.3, 0.95, 0.4]])
    assert streak_score(probability, 1).tolist() == pytest.approx([0.9, 0.95])
    assert streak_score(probability, 2).tolist() == pytest.approx([0.7, 0.4])  # windows' lows: .2 .7 .1 / .3 .3 .4
    assert streak_score(probability, 5).tolist() == [0.0, 0.0]
    for needed in (1, 2, 3):
        for threshold in (0.15, 0.35, 0.5, 0.75, 0.92):
            judge = ScriptedJudge(probability.T.tolist())
            judge.threshold = threshold
            verdicts = ChunkVerdicts(judge, needed)
            verdicts.start(torch.zeros(2, 1, 2, 2, 3, dtype=torch.uint8))
            frames, active = torch.zeros(2, K, 2, 2, 3, dtype=torch.uint8), torch.ones(2, dtype=torch.bool)
            success = torch.stack([verdicts.update(frames, ["a", "b"], active) for _ in range(4)]).any(dim=0)
            assert success.tolist() == (streak_score(probability, needed) >= threshold).tolist(), (needed, threshold)
    # a threshold of its own for instruction "b" (reward.calibrate.threshold_per_task); "a" keeps the judge's
    judge = ScriptedJudge(probability.T.tolist())
    judge.threshold, judge.task_thresholds = 0.85, {"b": 0.96}
    verdicts = ChunkVerdicts(judge, 1)
    verdicts.start(torch.zeros(2, 1, 2, 2, 3, dtype=torch.uint8))
    frames, active = torch.zeros(2, K, 2, 2, 3, dtype=torch.uint8), torch.ones(2, dtype=torch.bool)
    success = torch.stack([verdicts.update(frames, ["a", "b"], active) for _ in range(4)]).any(dim=0)
    assert success.tolist() == [True, False]  # at 0.85 for both, "b" (0.95) would pass


def test_success_must_hold_for_success_chunks_consecutive_chunks():
    # env 0: judged a success at chunks 1 and 2; env 1: at chunks 0 and 2 (isolated verdicts)
    verdicts = [[False, True], [True, False], [True, True], [False, False]]
    outcomes = {}
    for needed in (1, 2):
        env = ImaginedEnv(ToyWorldModel(), ScriptedJudge(verdicts), make_pool(), 2, 2, max_steps=16, kir_ratio=0.0, success_chunks=needed)
        env.reset([0, 0], [0, 0])
        steps = [env.step(torch.zeros(2, K, 2)) for _ in range(4)]
        successes, rewards = [s.success.any(dim=1).tolist() for s in steps], [s.reward.tolist() for s in steps]
        outcomes[needed] = (successes, rewards, steps[-1].truncated.tolist())
    first_verdict = [[False, True], [True, False], [False, False], [False, False]]
    assert outcomes[1][0] == first_verdict and outcomes[1][1][1] == [5.0, 0.0]
    confirmed = [[False, False], [False, False], [True, False], [False, False]]
    assert outcomes[2][0] == confirmed  # env 0 at the second verdict in a row; env 1's verdicts never follow each other
    assert outcomes[2][1][2] == [5.0, 0.0] and sum(r[1] for r in outcomes[2][1]) == 0.0 and outcomes[2][2] == [False, True]
    with pytest.raises(ValueError, match="success_chunks"):
        ImaginedEnv(ToyWorldModel(), ToyJudge(), make_pool(), 8, 4, success_chunks=0)


def test_bad_input_gives_clear_errors():
    with pytest.raises(ValueError, match="judge reads 64x64 frames but the world model renders 32x32"):
        ImaginedEnv(ToyWorldModel(image_size=32), ToyJudge(image_size=64), make_pool(), 8, 4)
    with pytest.raises(ValueError, match="multiple of group_size"):
        ImaginedEnv(ToyWorldModel(), ToyJudge(), make_pool(), 6, 4)
    env = make_env()
    env.reset([0] * 8, [0] * 8)
    with pytest.raises(ValueError, match="expected"):
        env.step(torch.zeros(8, K, 3))
    with pytest.raises(ValueError, match="unknown task"):
        env.reset(["fly to the moon"] * 8, [0] * 8)
