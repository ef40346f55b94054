import glob, sys, torch, numpy as np
from worldloop.worldmodel import vae as vl
from worldloop.worldmodel.metrics import psnr, ssim
from worldloop.worldmodel.rollout import autocast
def main():
    cands = glob.glob("/**/t3/vae/config.json", recursive=True)
    print(cands)
    v = vl.load_vae(cands[0].rsplit("/", 1)[0]).cuda().eval()
    w = vl.load_vae(cands[0].replace("/vae/", "/wm/vae/").rsplit("/", 1)[0]).cuda().eval()
    from worldloop.config import load_config
    from worldloop.data.collect import collection_plan, run_batch, expert_driver
    from worldloop.sims import make_env
    from worldloop.sims.tasks import resolve_tasks
    config = load_config("metaworld-gpu", ["sim.image_size=64", "device=cuda", "sim.num_workers=10"])
    tasks = resolve_tasks(config.sim)
    plan = collection_plan(tasks, 1, 0.5, 5)
    env = make_env(config, 10, tasks=tasks)
    eps = [e for _, e in run_batch(env, plan[:10], expert_driver, config.expert)]
    env.close()
    f = torch.stack([torch.as_tensor(e["frames"][:13]) for e in eps]).cuda()
    dev = torch.device("cuda")
    with torch.no_grad():
        for name, vae in (("vae", v), ("wm/vae", w)):
            for ac in (True, False):
                ctx = autocast(dev) if ac else torch.autocast("cuda", enabled=False)
                with ctx:
                    r9 = vl.decode(vae, vl.encode(vae, f[:, :9]))
                    r13 = vl.decode(vae, vl.encode(vae, f))
                    seq = torch.cat([f[:, :1].expand(-1, 5, -1, -1, -1), f[:, 1:9]], 1)
                    rs = vl.decode(vae, vl.encode(vae, seq))
                print(name, "autocast", ac, "9:", float(psnr(r9, f[:, :9]).mean()), "13:", float(psnr(r13, f).mean()), "static-ctx:", float(psnr(rs, seq).mean()), "per-frame", psnr(rs, seq).mean(0).tolist())
if __name__ == "__main__":
    main()
