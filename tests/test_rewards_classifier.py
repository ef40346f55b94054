"""Success classifier: labels, augmentations, learning a synthetic cue, save/load, calibration, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from _rewards_fixtures import TASKS, FakeEpisode, cue_episodes
from worldloop.rewards.augment import colour_jitter, gaussian_blur, pixel_noise, world_model_artefacts
from worldloop.rewards.classifier import SuccessClassifier
from worldloop.rewards.configuration import ClassifierConfig, ClassifierTrainingConfig, RewardConfig
from worldloop.rewards.labels import LabelledFrames, frame_labels, labelled_frames
from worldloop.rewards.metrics import auroc, suggest_thresholds, value_order_correlation
from worldloop.rewards import load_judge
from worldloop.rewards.protocol import Judge

STEPS = 300  # converged on AVX2 and AVX-512 CPUs alike (150 left recall at 0.67 on an AMD EPYC)


def test_labels_pair_each_frame_with_the_success_of_the_action_before_it():
    frames = np.arange(5)[:, None, None, None].repeat(2, 1).repeat(2, 2).repeat(3, 3).astype(np.uint8)
    episode = FakeEpisode(frames, np.array([0, 0, 1, 1, 1], dtype=bool), TASKS[0], 0, 7)
    times, labels = frame_labels(episode)
    assert times.tolist() == [1, 2, 3, 4] and labels.tolist() == [False, False, True, True]
    # A dataset that also stores the observation after the last action labels it too.
    longer = FakeEpisode(np.concatenate([frames, frames[-1:]]), episode.success, TASKS[0], 0, 7)
    assert frame_labels(longer)[1].tolist() == [False, False, True, True, True]
    data = labelled_frames([episode], list(TASKS))
    assert data.frames[:, 0, 0, 0].tolist() == [1, 2, 3, 4] and data.time.tolist() == [1, 2, 3, 4]
    # Episodes are numbered in the order read, so two datasets' episode 7 stay apart, also when joined.
    two = labelled_frames([episode, episode], list(TASKS))
    assert two.episode.tolist() == [0] * 4 + [1] * 4
    assert LabelledFrames.cat([two, data]).episode.tolist() == [0] * 4 + [1] * 4 + [2] * 4


def test_episode_threshold_judges_episodes_the_way_rl_does():
    """Per episode, the score is the highest P(success) among the frames judged once per chunk; the
    'episode_kappa' threshold agrees best with the simulator beyond chance, the highest such one."""
    from worldloop.rewards.metrics import max_kappa_threshold
    from worldloop.rewards.train import episode_scores, episode_summary

    # two episodes of 9 labelled frames (times 1..9), verdicts at times 4 and 8 (chunks of 4)
    success = torch.tensor([False] * 9 + [False] * 6 + [True] * 3)
    data = LabelledFrames(torch.zeros(18, 2, 2, 3, dtype=torch.uint8), success, torch.tensor([0] * 9 + [1] * 9),
                          torch.tensor([0] * 9 + [1] * 9), torch.arange(1, 10).repeat(2), list(TASKS))  # fmt: skip
    probabilities = np.zeros(18)
    probabilities[[2, 3, 8]] = [0.99, 0.4, 0.97]  # episode 0: time 3 (not judged), 4 (judged) and 9 (not judged)
    probabilities[[9 + 3, 9 + 7]] = [0.2, 0.7]  # episode 1: its judged frames, times 4 and 8
    scores, real, task = episode_scores(probabilities, data, verdict_every=4)
    assert scores.tolist() == [0.4, 0.7] and real.tolist() == [False, True] and task.tolist() == [0, 1]
    verdicts = episode_summary(probabilities, data, threshold=0.3, verdict_every=4)
    assert (verdicts["false_success"], verdicts["missed_success"], verdicts["judged_success_once"]) == (1, 0, 1.0)
    # two verdicts in a row (rl.success_chunks=2): an episode scores the lower of its best pair; episode 0's single
    # judged false positive (0.4 at time 4, then 0 at time 8) no longer makes it a success at 0.3
    scores, _, _ = episode_scores(probabilities, data, verdict_every=4, success_chunks=2)
    assert scores.tolist() == [0.0, 0.2]
    verdicts = episode_summary(probabilities, data, threshold=0.15, verdict_every=4, success_chunks=2)
    assert (verdicts["false_success"], verdicts["missed_success"], verdicts["success_chunks"]) == (0, 0, 2)
    # Hand-worked, success [F, T, F, T] and scores 0.1-0.4: ">= 0.2" judges [F, T, T, T] (agreement 3/4,
    # chance 1/2, kappa 1/2), ">= 0.3" [F, F, T, T] (kappa 0), ">= 0.4" [F, F, F, T] (kappa 1/2 again).
    scores, truth = np.array([0.1, 0.2, 0.3, 0.4]), np.array([False, True, False, True])
    assert max_kappa_threshold(scores, truth, np.zeros(4)) == pytest.approx(0.4)  # the highest of the best
    # Chance within tasks: when task 0 always succeeds and task 1 always fails, separating them is no
    # skill (kappa <= 0 at every threshold): none is chosen; pooled, 0.3 is perfect.
    scores, truth = np.array([0.3, 0.4, 0.1, 0.2]), np.array([True, True, False, False])
    assert max_kappa_threshold(scores, truth, np.zeros(4)) == pytest.approx(0.3)
    assert max_kappa_threshold(scores, truth, np.array([0, 0, 1, 1])) is None
    # Significance: [F, T, F, T] at 0.4 has kappa 1/2 (agreement 3/4, SE sqrt(3/16 / 4) * 2 ~ 0.433), 1.15 SE above 0
    scores, truth = np.array([0.1, 0.2, 0.3, 0.4]), np.array([False, True, False, True])
    assert max_kappa_threshold(scores, truth, np.zeros(4), significance_se=1.0) == pytest.approx(0.4)
    assert max_kappa_threshold(scores, truth, np.zeros(4), significance_se=1.2) is None
    assert max_kappa_threshold(np.full(4, 0.5), np.ones(4, bool), np.zeros(4)) is None  # chance 1: undefined
    # Within standard errors: 8 episodes, success [F F F T F T T T], scores 0.1 ... 0.8. ">= 0.4" and
    # ">= 0.6" each misjudge one episode (agreement 7/8, chance 1/2: kappa 3/4, SE sqrt(7/64 / 8) * 2 ~ 0.234);
    # ">= 0.7" two (kappa 1/2), ">= 0.8" three (kappa 1/4). The floor 3/4 - k * 0.234 admits 0.6 at k = 1,
    # 0.7 at k = 2 (floor 0.28) and 0.8 at k = 3 (floor 0.05).
    scores, truth = np.arange(1, 9) / 10, np.array([False, False, False, True, False, True, True, True])
    chosen = [max_kappa_threshold(scores, truth, np.zeros(8), tolerance_se=k) for k in (0, 1, 2, 3)]
    assert chosen == pytest.approx([0.6, 0.6, 0.7, 0.8])


def test_no_success_frame_to_train_on_is_named_with_what_was_found(tmp_path):
    from worldloop.rewards.train import train_classifier

    frames = np.zeros((4, 8, 8, 3), dtype=np.uint8)
    episode = FakeEpisode(frames, np.array([0, 0, 0, 1], dtype=bool), TASKS[0], 0, 0)  # ends at its first success
    data = labelled_frames([episode], list(TASKS))
    assert not data.success.any()
    with pytest.raises(ValueError, match="none of the 1 episodes has a success-labelled frame: .*success_hold_steps > 0"):
        train_classifier(data, None, RewardConfig(training=ClassifierTrainingConfig(steps=1)), tmp_path, torch.device("cpu"))
    # successes only among the held-out episodes: the message says so, and how many there are
    held = FakeEpisode(frames, np.array([0, 0, 1, 1], dtype=bool), TASKS[0], 1, 0)
    with pytest.raises(ValueError, match=r"the 1 training episodes hold no success-labelled frame; the only 1 successful episode\(s\) "
                                         r"\(1 success frames\) are among the 2 held out .*too few successful episodes"):  # fmt: skip
        train_classifier(data, labelled_frames([episode, held], list(TASKS)), RewardConfig(training=ClassifierTrainingConfig(steps=1)),
                         tmp_path, torch.device("cpu"))  # fmt: skip
    with pytest.raises(ValueError, match="threshold_from"):
        ClassifierTrainingConfig(threshold_from="median").validate()


def test_augmentations_keep_shape_and_range_and_change_pixels():
    torch.manual_seed(0)
    images = torch.rand(6, 3, 16, 16)
    for out in (colour_jitter(images, 0.3), gaussian_blur(images, 1.0), pixel_noise(images, 0.1), world_model_artefacts(images, 0.5, 0.2, 0.05)):
        assert out.shape == images.shape and out.min() >= 0 and out.max() <= 1
        assert (out - images).abs().mean() > 1e-3
    blurred = gaussian_blur(images, 1.0)
    assert blurred.std() < images.std()  # blur removes high frequencies
    assert torch.equal(gaussian_blur(images, 0.0), images)


def test_metrics_on_hand_worked_numbers():
    assert auroc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == pytest.approx(0.75)
    assert auroc(np.array([0.1, 0.2]), np.array([1, 1])) is None
    assert suggest_thresholds(np.array([0.1, 0.2, 0.7, 0.9]), np.array([0, 0, 1, 1]))["max_f1"] == pytest.approx(0.7)
    voc = value_order_correlation(np.array([0.1, 0.2, 0.3, 0.9, 0.5, 0.1]), np.array([0, 1, 2, 0, 1, 2]), np.array([0, 0, 0, 1, 1, 1]))
    assert voc["mean"] == pytest.approx(0.0) and voc["episodes"] == 2


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A classifier trained on two tasks that share one scene: the same square means success for
    one task and failure for the other, so it must use its task conditioning."""
    from worldloop.rewards.train import train_classifier

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("rw")
    train = labelled_frames(cue_episodes(16, seed=0, size=16), list(TASKS))
    held_out = labelled_frames(cue_episodes(8, seed=1, size=16), list(TASKS))
    config = RewardConfig(ClassifierConfig(input_size=16), ClassifierTrainingConfig(steps=STEPS, batch_size=16, lr=2e-3))
    metrics = train_classifier(train, held_out, config, out, torch.device("cpu"), seed=0)
    return out, metrics, held_out


def test_classifier_learns_a_task_dependent_success_cue(trained):
    out, metrics, held_out = trained
    assert metrics["steps"] == STEPS
    assert metrics["held_out"]["auroc"] > 0.95
    assert metrics["held_out"]["at_threshold"]["recall"] > 0.7 and metrics["held_out"]["at_threshold"]["precision"] > 0.7
    # Where the square is visible only the task says whether it means success: the same frames
    # judged under the other task must rank the other way round.
    judge = load_judge(out, "cpu")
    visible = held_out.time > 6
    windows, labels = held_out.frames[visible][:, None], held_out.success[visible].numpy()
    right = [TASKS[i] for i in held_out.task[visible].tolist()]
    swapped = [TASKS[1 - i] for i in held_out.task[visible].tolist()]
    assert auroc(judge.score(windows, right).numpy(), labels) > 0.9
    assert auroc(judge.score(windows, swapped).numpy(), labels) < 0.1
    assert (out / "metrics.json").is_file() and (out / "checkpoints" / "latest").is_file() and any((out / "tb").iterdir())


def test_episode_kappa_threshold_on_a_trained_classifier(trained):
    """On the held-out episodes, judged once every 4 frames, the chosen threshold's verdicts are the
    simulator's; metrics.json reports every set's episode verdicts at the saved threshold."""
    from worldloop.rewards.train import choose_threshold, episode_summary, predict

    out, metrics, held_out = trained
    assert metrics["held_out"]["episodes"]["count"] == 8 and metrics["held_out"]["episodes"]["verdict_every"] == 8
    model = SuccessClassifier.from_pretrained(out / "model")
    assert choose_threshold(model, "episode_kappa", held_out, "held_out", verdict_every=4) == (
        "episode_kappa on held_out (8 episodes, a verdict every 4 frames, the highest within 0 SE of the best)")
    verdicts = episode_summary(predict(model, held_out), held_out, model.threshold, verdict_every=4)
    assert verdicts["kappa"] == pytest.approx(1.0) and verdicts["false_success"] == verdicts["missed_success"] == 0
    assert model.threshold != 0.5


def test_saved_classifier_loads_and_scores_the_same(trained):
    from worldloop.rewards.train import predict

    out, _, held_out = trained
    judge = load_judge(out, "cpu")  # the run folder resolves to out/model
    assert isinstance(judge, Judge) and judge.window == 1 and judge.threshold == 0.5
    reloaded = SuccessClassifier.from_pretrained(out / "model")
    windows = held_out.frames[:, None]  # (N, 1, H, W, 3)
    instructions = [TASKS[i] for i in held_out.task.tolist()]
    scores = judge.score(windows, instructions)
    torch.testing.assert_close(scores, torch.from_numpy(predict(reloaded, held_out)), atol=1e-5, rtol=1e-5)
    assert torch.equal(judge.success(windows, instructions), scores >= 0.5)
    # RL can move its threshold without retraining it (rl.judge_threshold); null keeps the saved one.
    from worldloop.rl.envs import load_rl_judge
    from worldloop.config import load_config

    assert load_rl_judge(str(out), "cpu", load_config("micro")).threshold == 0.5
    moved = load_rl_judge(str(out), "cpu", load_config("micro", ["rl.judge_threshold=0.9"]))
    assert moved.threshold == 0.9 and torch.equal(moved.success(windows, instructions), scores >= 0.9)
    with pytest.raises(ValueError, match="judge_threshold is a probability"):
        load_config("micro", ["rl.judge_threshold=1.5"])
    # It remembers the side of its training frames, and an imagined env with another world-model resolution refuses it.
    from worldloop.envs.imagined import ImaginedEnv
    from worldloop.envs.toy import ToyWorldModel

    side = held_out.frames.shape[1]
    assert judge.image_size == side
    with pytest.raises(ValueError, match=f"judge reads {side}x{side} frames but the world model renders {2 * side}x{2 * side}"):
        ImaginedEnv(ToyWorldModel(image_size=2 * side), judge, [], 8, 4)


def test_classifier_bad_input_gives_clear_errors(trained):
    judge = load_judge(trained[0], "cpu")
    frames = torch.zeros(2, 2, 16, 16, 3, dtype=torch.uint8)
    with pytest.raises(ValueError, match="windows of 1 frames, got 2"):
        judge.score(frames, list(TASKS))
    with pytest.raises(ValueError, match=r"one instruction per window \(2\), got 1"):
        judge.score(frames[:, :1], TASKS[:1])
    with pytest.raises(ValueError, match="unknown"):
        judge.score(frames[:, :1], ["fly to the moon", TASKS[0]])
    with pytest.raises(FileNotFoundError):
        load_judge(trained[0] / "missing", "cpu")


def test_calibrate_classifier_writes_metrics_and_histogram(trained, tmp_path):
    from worldloop.rewards.calibrate import calibrate
    from worldloop.utils.io import read_json

    judge = load_judge(trained[0], "cpu")
    metrics = calibrate(judge, cue_episodes(8, seed=2, size=16), tmp_path, "classifier", stride=1)
    assert metrics == read_json(tmp_path / "metrics.json")
    # 11 labelled frames per episode; success after actions 6..11 labels frames 7..11 (5 per successful episode)
    assert metrics["windows"] == 8 * 11 and metrics["success_windows"] == 4 * 5
    assert metrics["auroc"] > 0.9
    assert 0 < metrics["at_threshold"]["trigger_rate"] < 1
    assert metrics["value_order_correlation"]["episodes"] == 4  # the successful episodes
    assert metrics["value_order_correlation"]["mean"] > 0.5  # the score rises once the cue shows
    assert 0 < metrics["suggested_threshold"]["max_f1"] < 1
    assert (tmp_path / "histogram.png").read_bytes()[:4] == b"\x89PNG"


class ReplayWorldModel:
    """A stand-in world model over known episodes: ``oracle`` imagines the real next frames, otherwise
    it imagines the first frame forever (a model that never moves: the success cue never shows)."""

    chunk_size = 4
    device = torch.device("cpu")

    def __init__(self, episodes, oracle: bool):
        self.episodes, self.oracle = episodes, oracle

    def reset(self, first_frames, seeds=None):
        self.t = 0

    def step(self, actions):
        chunk = []
        for episode in self.episodes[: len(actions)]:
            frames = np.asarray(episode.frames)
            index = np.minimum(np.arange(self.t + 1, self.t + 1 + self.chunk_size), len(frames) - 1) if self.oracle else np.zeros(self.chunk_size, int)
            chunk.append(torch.as_tensor(frames[index]))
        self.t += self.chunk_size
        return torch.stack(chunk)


def test_judging_world_model_frames_against_the_simulator(trained, tmp_path):
    import dataclasses

    from worldloop.data.dataset import Episode
    from worldloop.rewards.calibrate import calibrate

    judge = load_judge(trained[0], "cpu")
    episodes = [Episode(e.frames, np.zeros((len(e.frames), 4), np.float32), None, e.success, e.instruction, e.task_index, e.index) for e in cue_episodes(8, seed=2, size=16)]
    oracle = calibrate(judge, episodes, tmp_path / "oracle", "classifier", ReplayWorldModel(episodes, oracle=True), stride=1)
    agreement = oracle["world_model"]
    assert agreement["window_verdict_agreement"] == 1.0 and agreement["imagined"]["auroc"] == pytest.approx(oracle["auroc"])
    assert agreement["episodes"]["count"] == 8 and agreement["episodes"]["real_success_once"] == 0.5
    assert (tmp_path / "oracle" / "histogram_imagined.png").is_file()

    # a frozen world model never shows the cue: the judge misses the successes the simulator saw
    frozen = calibrate(judge, episodes, tmp_path / "frozen", "classifier", ReplayWorldModel(episodes, oracle=False), stride=1)["world_model"]
    assert frozen["window_verdict_agreement"] < 1.0 and frozen["episodes"]["missed_success"] >= 3
    assert frozen["episodes"]["agreement"] <= 0.625
    # a judge that never fires agrees with the simulator exactly as often as chance: kappa 0 (the oracle's is higher)
    assert frozen["episodes"]["kappa"] == pytest.approx(0.0, abs=1e-9) and agreement["episodes"]["kappa"] > 0.5, (frozen, agreement)
    # the imagined copies keep their labels and lengths; only frames 1.. are imagined
    from worldloop.rewards.agreement import imagined_episodes

    imagined = imagined_episodes(ReplayWorldModel(episodes, oracle=False), episodes[:2], batch=2)
    assert all(np.array_equal(a.success, b.success) and len(a.frames) == len(b.frames) for a, b in zip(imagined, episodes))
    assert np.array_equal(imagined[0].frames[5], episodes[0].frames[0]) and dataclasses.is_dataclass(imagined[0])


def test_training_resumes_from_its_latest_checkpoint(tmp_path, capsys):
    from worldloop.rewards.train import train_classifier

    data = labelled_frames(cue_episodes(4, size=16), list(TASKS))
    config = RewardConfig(ClassifierConfig(input_size=16), ClassifierTrainingConfig(steps=2, batch_size=4))
    train_classifier(data, None, config, tmp_path, torch.device("cpu"))
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_000000002"
    metrics = train_classifier(data, None, RewardConfig(ClassifierConfig(input_size=16), ClassifierTrainingConfig(steps=3, batch_size=4)), tmp_path, torch.device("cpu"))
    assert "resuming" in capsys.readouterr().out and metrics["steps"] == 3 and metrics["held_out"] is None
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_000000003"


def test_a_judge_saved_without_task_conditioning_is_refused_by_name(trained, tmp_path):
    """reward.classifier.conditioning was retired (always 'task'): a folder saved with 'none' names it; one with 'task' loads."""
    import json
    import shutil

    out, _, _ = trained
    folder = shutil.copytree(out / "model", tmp_path / "model")
    assert json.loads((folder / "config.json").read_text())["conditioning"] == "task"
    assert SuccessClassifier.from_pretrained(folder).threshold == 0.5
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"conditioning": "none"}))
    with pytest.raises(ValueError, match="conditioning='none'; reward.classifier.conditioning was retired"):
        SuccessClassifier.from_pretrained(folder)
