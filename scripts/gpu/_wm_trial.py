"""Temporary trial driver (no av on the GPU host): collect with the expert into memory, then VAE + WM + eval."""
import sys, time, json
from dataclasses import dataclass
import numpy as np, torch
from worldloop.config import load_config
from worldloop.data.collect import collection_plan, run_batch, expert_driver
from worldloop.sims import make_env
from worldloop.sims.tasks import resolve_tasks
from worldloop.worldmodel.train import train_vae, train_world_model
from worldloop.worldmodel.vae import load_vae
from worldloop.worldmodel.evaluate import evaluate_world_model
from worldloop.worldmodel.rollout import WorldModel

@dataclass
class Ep:
    frames: np.ndarray
    actions: np.ndarray

def main():
    out = sys.argv[1]; image = int(sys.argv[2]); per_task = int(sys.argv[3]); vae_s = float(sys.argv[4]); wm_s = float(sys.argv[5])
    overrides = sys.argv[6:]
    config = load_config("metaworld-gpu", [f"sim.image_size={image}", "device=cuda", "collect.num_envs=80", "sim.num_workers=16"] + overrides)
    tasks = resolve_tasks(config.sim)
    plan = collection_plan(tasks, per_task, config.collect.noisy_fraction, 0)
    env = make_env(config, 80, tasks=tasks)
    eps = {}
    t = time.time()
    for first in range(0, len(plan), 80):
        batch = plan[first:first + 80]
        padded = batch + [batch[-1]] * (80 - len(batch))
        for i, e in run_batch(env, padded, expert_driver, config.expert):
            if i < len(batch):
                eps[first + i] = (batch[i].task, Ep(e["frames"], e["actions"]))
    env.close()
    lengths = [len(e.frames) for _, e in eps.values()]
    print(f"collected {len(eps)} episodes in {time.time()-t:.0f}s, length {np.mean(lengths):.0f} (min {min(lengths)}, max {max(lengths)})", flush=True)
    train, held = [], []
    for k in sorted(eps):
        (held if k % 10 == 9 else train).append(eps[k][1])
    dev = torch.device("cuda")
    down = 3 if image >= 128 else 2
    config.vae.size = "small"; config.vae.spatial_downsamples = down; config.vae.steps = 8000; config.vae.batch_size = 16; config.vae.lr = 1e-3; config.vae.time_limit_s = vae_s; config.vae.log_every = 100; config.vae.checkpoint_every = 100000
    t = time.time()
    m = train_vae(config.vae, train, held, f"{out}/vae", dev)
    print("vae", round(time.time() - t), json.dumps(m), flush=True)
    wmc = config.world_model
    wmc.size = "small"; wmc.steps = 20000; wmc.batch_size = 64; wmc.time_limit_s = wm_s; wmc.sample_every = 100000; wmc.checkpoint_every = 100000; wmc.ema_decay = 0.995; wmc.gradient_checkpointing = False; wmc.lr = 5e-4
    t = time.time()
    train_world_model(wmc, train, load_vae(f"{out}/vae"), f"{out}/wm", dev)
    print("wm", round(time.time() - t), open(f"{out}/wm/results.json").read(), flush=True)
    model = WorldModel.from_pretrained(f"{out}/wm", dev)
    import worldloop.data.video as V
    V.write_mp4 = lambda *a, **k: None
    from worldloop.worldmodel import vae as vl
    from worldloop.worldmodel.metrics import psnr, ssim
    from worldloop.worldmodel.rollout import sample_future
    with torch.no_grad():
        f = torch.stack([torch.as_tensor(e.frames[:9]) for e in held[:10]]).to(dev)
        seq = torch.cat([f[:, :1].expand(-1, 5, -1, -1, -1), f[:, 1:9]], 1)
        lat = torch.cat([vl.encode(model.vae, f[:, :1]).float(), vl.encode(model.vae, seq).float()[:, :, 1:]], 2)
        rec = vl.decode(model.vae, lat)[:, 5:]
        print("vae-recon h8", float(psnr(rec, f[:, 1:9]).mean()), float(ssim(rec, f[:, 1:9]).mean()))
        acts = torch.zeros(10, 13, 4, device=dev); acts[:, 5:] = torch.stack([torch.as_tensor(e.actions[:8]) for e in held[:10]])
        g = torch.Generator(device=dev).manual_seed(0)
        new = sample_future(model.dit, lat[:, :, :2], model.normalise(acts), torch.randn(lat[:, :, 2:].shape, device=dev, generator=g), model.sigmas)
        tf = vl.decode(model.vae, torch.cat([lat[:, :, :2], new], 2))[:, 5:]
        print("teacher-forced h8", float(psnr(tf, f[:, 1:9]).mean()), float(ssim(tf, f[:, 1:9]).mean()))
        for steps in ():
            model.set_sampling(steps, 5.0, "cached")
            new = sample_future(model.dit, lat[:, :, :2], model.normalise(acts), torch.randn(lat[:, :, 2:].shape, device=dev, generator=g), model.sigmas)
            tf = vl.decode(model.vae, torch.cat([lat[:, :, :2], new], 2))[:, 5:]
            print("tf steps", steps, float(psnr(tf, f[:, 1:9]).mean()), float(ssim(tf, f[:, 1:9]).mean()))
        model.set_sampling(5, 5.0, "cached")
    res = evaluate_world_model(model, held[:32], [8, 32, 64, 128], f"{out}/eval", videos=4)
    for h, r in res["horizons"].items():
        print(h, {k: round(v, 3) for k, v in r.items()})
    print("fps", res["rollout_frames_per_second"])

if __name__ == '__main__':
    main()
