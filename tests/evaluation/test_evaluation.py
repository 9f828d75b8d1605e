"""`omnirl eval` and in-run validation: one sampler (the rollout engine), one σ grid (the adapter's,
or the manifest's override), one reward (the weighted sum of every reward) — issue 13.

The validation side runs the real path a run takes, on a real redis-server: the controller's
`Validator` publishes its requests, a rollout step turns them into engine requests as the rollout
role does (`sample_requests`) and publishes the images, the real `RewardService` scores them, and
the `Validator` summarises the round. The eval side is `omnirl eval --checkpoint` itself.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from safetensors.torch import load_file

from omnirl.actor.checkpoint import save_checkpoint
from omnirl.algorithms import sigma_schedule
from omnirl.api.loader import load_rljob
from omnirl.api.messages import GenerateRequest, SampleMeta, SampleSeed, ScoreMeta
from omnirl.api.runtime import RoleEnv
from omnirl.cli import main as cli_main
from omnirl.controller.data import read_prompts
from omnirl.controller.grid import save_image_grid, tile_caption
from omnirl.controller.validation import Validator
from omnirl.evaluation.evaluate import evaluate, sample_heldout
from omnirl.models.digits.adapter import BUILTIN_DIR
from omnirl.models.policy_io import load_policy
from omnirl.models.registry import adapter_options, load_adapter, load_tokenizer
from omnirl.reward.service import RewardService
from omnirl.rollout.engine import RolloutEngine
from omnirl.rollout.requests import entry_requests, sample_requests
from omnirl.transfer import TransferQueue

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "examples" / "prompts" / "ocr-heldout.txt"


def _job(tmp: Path, name: str, model: dict, shift: float | None = None) -> Path:
    """A manifest with two weighted rewards, 4 held-out prompts, 4 validation steps, seed 7."""
    doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec["model"] = model
    spec["data"] = {"trainPrompts": str(HELDOUT), "validationPrompts": str(HELDOUT)}
    if shift is not None:
        spec["algorithm"]["sampling"]["shift"] = shift
    spec["reward"] = [{"name": "ocr", "kind": "ocr", "params": {"alphabet": "0123456789"}},
                      {"name": "jpeg", "kind": "jpeg", "weight": 0.5}]
    spec["validation"] = {"everySteps": 1, "numSteps": 4, "maxPrompts": 4, "seed": 7}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _checkpoint(adapter, root: Path, noise: float = 0.02) -> Path:
    """A run's checkpoint of `adapter`'s weights moved by seeded noise (so it is not the base model)."""
    g = torch.Generator().manual_seed(3)
    policy = {k: v + noise * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
              for k, v in adapter.module.state_dict().items()}
    save_checkpoint(root, 3, policy=policy, trained={}, old=None, optimizer=({}, {"param_groups": [], "scalars": {}}),
                    state={"step": 3, "policy_version": 3, "lora": False})
    return root / "latest"


def _validation_round(job_path: Path, ckpt: Path, redis_url: str, out: Path) -> dict:
    """One validation round of the checkpoint through Validator → rollout → RewardService → Validator."""
    job = load_rljob(job_path)
    spec = job.spec
    adapter = load_adapter(spec.model.family, spec.model.path, dtype=spec.model.dtype, **adapter_options(spec))
    load_policy(adapter, ckpt, spec.model.lora)
    adapter.module.eval()
    queue = TransferQueue.from_url(redis_url, job.metadata.name)
    streams = queue.streams
    env = RoleEnv(job_name=job.metadata.name, redis_url=redis_url, weight_sync_host="127.0.0.1", weight_sync_port=0,
                  worker_id="reward-0", out_dir=str(out))
    reward = RewardService(job, env)
    try:
        # the controller tokenizes with the tokenizers alone
        validator = Validator(queue, spec, load_tokenizer(spec.model.family, spec.model.path), out, nonce=5)
        validator.publish(at_step=3, version=3)
        queue.ensure_group(streams.requests, "rollout")
        engine = RolloutEngine(adapter, max_batch_size=spec.roles.rollout.maxBatchSize)
        for msg in queue.consume(streams.requests, "rollout", "rollout-0", count=100, block_ms=100):
            for sample in entry_requests(msg.meta):  # as the rollout role reads an entry
                engine.submit(sample)
        for r in engine.run_until_idle():  # publish as the rollout role does
            m = r.request.meta
            meta = SampleMeta(sample_id=r.request.sample_id, kind=m["kind"], step=m["step"], group_id=m["group_id"],
                              prompt=r.request.prompt, prompt_ids=list(r.request.prompt_ids), policy_version=3,
                              noise_level=r.request.noise_level, sde_type=r.request.sde_type, worker="rollout-0",
                              generated_at=time.time(), rollout_seconds=0.0)
            queue.publish(streams.samples, meta.model_dump(), {"x0": r.x0}, image=r.image)
        queue.ensure_group(streams.samples, "reward")
        reward.score_batch(queue.consume(streams.samples, "reward", "reward-0", count=100, block_ms=100))
        queue.ensure_group(streams.scores, "controller")
        for msg in queue.consume(streams.scores, "controller", "controller-0", count=100, block_ms=100):
            validator.record(ScoreMeta.model_validate(msg.meta), msg.tensor_key)
        assert validator.complete
        return validator.finish()
    finally:
        reward.close()


def _eval(job_path: Path, ckpt: Path, out: Path) -> dict:
    assert cli_main(["eval", str(job_path), "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    return json.loads((out / "rewards.json").read_text())


def _assert_same(val: dict, ev: dict) -> None:
    assert ev["n"] == val["n"] == 4
    assert ev["mean_reward"] == pytest.approx(val["val_reward_mean"], abs=1e-6)
    assert ev["exact_match"] == pytest.approx(val["val_exact_match"], abs=1e-9)
    # the weighted sum of both rewards, not the first one alone
    assert val["val_reward_mean"] == pytest.approx(val["val_reward_ocr"] + 0.5 * val["val_reward_jpeg"], abs=1e-6)
    assert abs(val["val_reward_jpeg"]) > 0.05  # the second reward counts


def _captions_read(grid: Path, n: int, cell_w: int) -> list[str]:
    """What the OCR recogniser reads in the caption strip of each of the first `n` tiles of a one-row grid of
    32-px-high images `cell_w` wide (`save_image_grid`'s layout: 2-px padding, a 12-px caption under each)."""
    from omnirl.reward.ocr import OCRScorer

    pixels = np.asarray(Image.open(grid).convert("RGB"))
    strips = [pixels[2 + 32 : 2 + 44, 2 + k * (cell_w + 2) : 2 + k * (cell_w + 2) + cell_w] for k in range(n)]
    return OCRScorer(alphabet="0123456789.").read(np.stack(strips))


def test_eval_equals_validation_builtin(tmp_path, redis_url):
    job = _job(tmp_path, "evalval-digits", {"family": "ocr-digits", "path": "builtin", "dtype": "float32"})
    ckpt = _checkpoint(load_adapter("ocr-digits", "builtin"), tmp_path / "ckpt")
    val = _validation_round(job, ckpt, redis_url, tmp_path / "val")
    ev = _eval(job, ckpt, tmp_path / "eval")
    _assert_same(val, ev)
    assert ev["prompts"] == read_prompts(HELDOUT)[:4]
    # each tile's caption: its score, then the text its prompt asked for (it was the score alone, issue 31)
    targets = [p.split('"')[1] for p in ev["prompts"]]
    for grid in (Path(val["grid"]), tmp_path / "eval" / "grid.png"):
        assert _captions_read(grid, 4, 128) == [f"{r:.2f}".lstrip("-") + t for r, t in zip(ev["rewards"], targets,
                                                                                           strict=True)], grid
    # the denoising steps per sample under a name that does not read as the checkpoint's training steps
    assert (ev["denoising_steps"], ev["sampler"]) == (4, "ode") and "steps" not in ev
    # the record names the step directory scored, not `latest` as given (which moves while a run goes on)
    assert (ev["checkpoint"], ev["checkpoint_step"], ev["policy_version"]) == (
        str((tmp_path / "ckpt" / "step-000003").resolve()), 3, 3)


def test_a_held_out_sample_is_denoised_as_eval_denoises_it_however_its_request_arrives(tmp_path, redis_url):
    """Issue 36: a validation round's requests reached the rollout worker one or a few at a time and joined
    whatever it was denoising (the first sample's first step alone, the next three joining it, a training
    group beside them); the σ conditioning's fp32 GEMMs round differently at another batch size, so the
    latents moved by up to 5e-7 from `omnirl eval`'s, and a pixel that rounded the other way moved a JPEG-size
    reward by 7e-3. Now the round travels in cohorts the engine denoises together and alone, and eval runs the
    same cohorts: bitwise the same latents, with a training group in flight and one entry read per step."""
    job = load_rljob(_job(tmp_path, "cohorts", {"family": "ocr-digits", "path": "builtin", "dtype": "float32"}))
    spec = job.spec.model_copy(deep=True)
    spec.validation.maxPrompts = 6  # two cohorts of maxBatchSize 4: prompts 0-3 (5 digits) and 4-5 (3, 4)
    spec.roles.rollout.maxBatchSize = 4
    adapter = load_adapter("ocr-digits", "builtin")
    adapter.module.eval()
    queue = TransferQueue.from_url(redis_url, "cohorts")
    streams = queue.streams
    try:
        Validator(queue, spec, adapter.tokenize, tmp_path, nonce=0).publish(at_step=2, version=2)
        assert queue.stream_length(streams.requests) == 2  # one entry per cohort
        engine = RolloutEngine(adapter, max_batch_size=spec.roles.rollout.maxBatchSize)
        train = GenerateRequest(kind="train", step=2, group_id="2:0", prompt='"24680"', prompt_ids=adapter.tokenize(
            '"24680"'), samples=[SampleSeed(sample_id=f"2:0:{k}", seed=k) for k in range(3)], num_steps=4)
        for sample in sample_requests(train):
            engine.submit(sample)
        in_run = {r.request.sample_id: r.x0 for r in engine.step()}  # the training group is under way
        queue.ensure_group(streams.requests, "rollout")
        while engine.has_work() or queue.lag(streams.requests, "rollout"):  # one entry per step, as it trickles in
            for msg in queue.consume(streams.requests, "rollout", "rollout-0", count=1, block_ms=0):
                for sample in entry_requests(msg.meta):
                    engine.submit(sample)
            in_run.update({r.request.sample_id: r.x0 for r in engine.step()})
    finally:
        queue.cleanup()
        queue.close()
    prompts = read_prompts(HELDOUT)[:6]
    offline = sample_heldout(adapter, spec, prompts)
    assert [r.x0.shape[-1] for r in offline] == [128, 128, 128, 128, 64, 64]
    for i, r in enumerate(offline):
        assert torch.equal(in_run[f"val2:{i}:0"], r.x0), i


@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory) -> Path:
    pytest.importorskip("diffusers")
    from tests.models.test_diffusers import _sd3_pipeline

    path = tmp_path_factory.mktemp("sd3_tiny")
    _sd3_pipeline().save_pretrained(path)  # scheduler shift 3.0: its own grid is not the unshifted one
    return path


@pytest.mark.parametrize(("shift", "sizes"), [(None, None), (1.5, None), (None, [[32, 32], [32, 48]])],
                         ids=["family-grid", "shift-override", "resolutions"])
def test_eval_equals_validation_tiny_sd3(tmp_path, redis_url, sd3_dir, shift, sizes):
    """Validation and `omnirl eval` agree; with `model.resolutions` both sample held-out prompt i at
    resolutions[i mod 2] (the grid's cells are as wide as the widest image)."""
    model = {"family": "sd3", "path": str(sd3_dir), "dtype": "float32",
             **({"resolutions": sizes} if sizes else {"resolution": [32, 32]})}
    name = "sizes" if sizes else "own" if shift is None else "override"
    job = _job(tmp_path, f"evalval-sd3-{name}", model, shift=shift)  # own keys
    spec = load_rljob(job).spec
    ckpt = _checkpoint(load_adapter("sd3", str(sd3_dir), **adapter_options(spec)), tmp_path / "ckpt")
    val = _validation_round(job, ckpt, redis_url, tmp_path / "val")
    ev = _eval(job, ckpt, tmp_path / "eval")
    _assert_same(val, ev)
    assert load_file(ckpt / "policy.safetensors").keys()  # a full-weights checkpoint was evaluated
    widest = 48 if sizes else 32
    assert Image.open(tmp_path / "eval" / "grid.png").size[0] == 4 * (widest + 2) + 2  # 4 prompts in one row


def test_sigma_grid_owner_family_default_and_override(sd3_dir):
    digits = load_adapter("ocr-digits", "builtin")
    shape = digits.latent_shape(digits.tokenize('"12"'))
    # the built-in demo's grid is what it always was (golden curves unchanged)
    assert torch.equal(digits.sigma_grid(10, shape), sigma_schedule(10, 1.0))
    assert digits.sigma_grid(4, shape, 3.0).tolist() == pytest.approx([1.0, 0.9, 0.75, 0.5, 0.0])
    sd3 = load_adapter("sd3", str(sd3_dir), resolution=(32, 32))
    shape = sd3.latent_shape([])
    own = sd3.sigma_grid(6, shape)
    assert torch.equal(own, sd3.sigmas(6, sd3.image_seq_len(shape)))  # the scheduler's (shift 3.0) grid
    assert not torch.allclose(own, sigma_schedule(6, 1.0), atol=1e-3)
    assert torch.equal(sd3.sigma_grid(6, shape, 1.5), sigma_schedule(6, 1.5))


def test_engine_samples_on_the_adapter_grid(sd3_dir):
    adapter = load_adapter("sd3", str(sd3_dir), resolution=(32, 32))
    ids = tuple(adapter.tokenize("a sign"))
    engine = RolloutEngine(adapter)
    from omnirl.rollout.types import SampleRequest

    for i, shift in enumerate([None, 2.0]):
        engine.submit(SampleRequest(sample_id=f"s{i}", prompt="a sign", prompt_ids=ids, seed=i, num_steps=5,
                                    window=(1, 2), shift=shift))
    got = {r.request.sample_id: r.sigmas for r in engine.run_until_idle()}
    shape = adapter.latent_shape(list(ids))
    assert torch.equal(got["s0"], adapter.sigma_grid(5, shape)[1:4])
    assert torch.equal(got["s1"], sigma_schedule(5, 2.0)[1:4])


def test_tokenizers_alone_match_the_adapter(sd3_dir, tmp_path):
    adapter = load_adapter("sd3", str(sd3_dir))
    # the controller's copy has no weights at all: only the tokenizers can have been read
    bare = tmp_path / "sd3"
    shutil.copytree(sd3_dir, bare)
    for weights in bare.glob("*/*.safetensors"):
        weights.unlink()
    tokenize = load_tokenizer("sd3", str(bare))
    for text in ['a sign that says "hi 42"', "x"]:
        assert tokenize(text) == adapter.tokenize(text)
    with pytest.raises(OSError):
        load_adapter("sd3", str(bare))
    digits = load_adapter("ocr-digits", "builtin")
    (tmp_path / "digits").mkdir()
    shutil.copy(BUILTIN_DIR / "config.json", tmp_path / "digits" / "config.json")
    assert load_tokenizer("ocr-digits", str(tmp_path / "digits"))('A sign that says "4071"') == \
        digits.tokenize('"4071"') == [5, 1, 8, 2]


def test_evaluate_is_batch_independent_and_sde_differs():
    spec = load_rljob(ROOT / "examples" / "ocr-nft.yaml").spec
    adapter = load_adapter("ocr-digits", "builtin")
    prompts = ['"123"', '"45678"', '"9012"']
    runs = [evaluate(adapter, spec, prompts, num_steps=3, seed=1, batch_size=b) for b in (1, 3)]
    sde = evaluate(adapter, spec, prompts, num_steps=3, seed=1, sampler="sde")
    # batch size changes only fp32 GEMM rounding: at most one grey level on a few pixels
    for a, b, s in zip(runs[0].images, runs[1].images, sde.images, strict=True):
        gap = torch.from_numpy(a).int() - torch.from_numpy(b).int()
        assert gap.abs().max() <= 1 and (gap != 0).float().mean() < 0.01
        assert (torch.from_numpy(a).float() - torch.from_numpy(s).float()).abs().mean() > 10  # SDE: other samples
    assert runs[0].rewards.tolist() == runs[1].rewards.tolist()
    assert [im.shape[1] for im in runs[0].images] == [64, 128, 64]
    with pytest.raises(ValueError, match="sampler"):
        evaluate(adapter, spec, prompts, sampler="euler")
    with pytest.raises(ValueError, match="empty"):
        evaluate(adapter, spec, [])


def test_validate_prints_the_grid(capsys, sd3_dir, tmp_path):
    sd3 = _job(tmp_path, "grid-sd3", {"family": "sd3", "path": str(sd3_dir), "resolution": [32, 32]})
    assert cli_main(["validate", str(ROOT / "examples" / "ocr-nft.yaml"),
                     str(ROOT / "examples" / "gpu-sd3-flowgrpo.yaml"), str(sd3)]) == 0
    out = capsys.readouterr().out
    assert (f"grid-sd3: σ grid: family default (sd3: its scheduler's grid, shift 3.0, 10 steps, from "
            f"{sd3_dir / 'scheduler' / 'scheduler_config.json'})") in out
    assert "ocr-nft: σ grid: family default (ocr-digits), shift 1, 10 steps: 1.0000, 0.9000 … 0.1000, 0.0000" in out
    assert "σ grid: override (algorithm.sampling.shift), shift 3, 10 steps: 1.0000, 0.9643 … 0.2500, 0.0000" in out


def test_save_image_grid_pads_mixed_widths(tmp_path):
    images = [np.zeros((32, 64, 3), np.uint8), np.full((32, 128, 3), 255, np.uint8), np.zeros((32, 64, 3), np.uint8)]
    path = save_image_grid(images, tmp_path / "g" / "grid.png", ncols=2, captions=["a", "b", "c"])
    grid = Image.open(path)
    assert grid.size == (2 * (128 + 2) + 2, 2 * (32 + 12 + 2) + 2)
    with pytest.raises(ValueError, match="uint8"):
        save_image_grid([np.zeros((4, 4, 3), np.float32)], tmp_path / "x.png")


def test_a_tile_caption_is_the_score_and_the_prompts_text_cut_to_its_tile(tmp_path):
    assert tile_caption('A sign that says "36882"', -1.2346) == '-1.23 "36882"'
    assert tile_caption("  a red cube on a table ", 0.5) == '0.50 "a red cube on a table"'  # no quotes: the line
    assert tile_caption('a sign that says "4', None) == '— "a sign that says "4"'  # one quote: the line as it is
    # a caption wider than its tile is cut there ("…"): it ran over the padding into the next tile
    images = [np.zeros((32, 64, 3), np.uint8)] * 2
    captions = [tile_caption("a photograph of a very long prompt that no tile can hold", 0.25)] * 2
    grid = np.asarray(Image.open(save_image_grid(images, tmp_path / "g.png", captions=captions)).convert("RGB"))
    assert (grid[34:46, 66:68] == 128).all()  # the padding between the two tiles' captions stays grey
    assert grid[34:46, 2:66].max() > 250  # the caption is drawn (white, anti-aliased)


def _two_ocr_job(tmp: Path, name: str, prompts: int) -> Path:
    """`_job` on the built-in model whose second reward is the same OCR at weight 0.5 (an OCR scorer
    served remotely, say): a sample read 2 of 3 digits right totals 0.67 + 0.33 = 1.0."""
    path = _job(tmp, name, {"family": "ocr-digits", "path": "builtin", "dtype": "float32"})
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["reward"][1] = {"name": "ocr-again", "kind": "ocr", "weight": 0.5}
    doc["spec"]["validation"]["maxPrompts"] = prompts
    path.write_text(yaml.safe_dump(doc))
    return path


def test_exact_match_counts_exact_readings_not_a_weighted_sum_that_reaches_1(tmp_path, redis_url):
    """`val_exact_match` and `omnirl eval`'s `exact_match` are the share of samples read exactly, the same
    whatever other rewards the job adds (was: the share whose weighted sum reached 1, so adding a second
    OCR reward at weight 0.5 turned 0.062 into 0.250 on the same images)."""
    job = _two_ocr_job(tmp_path, "exact-two-ocr", 32)
    ckpt = _checkpoint(load_adapter("ocr-digits", "builtin"), tmp_path / "ckpt", noise=0.0)  # legible digits
    val = _validation_round(job, ckpt, redis_url, tmp_path / "val")
    ev = _eval(job, ckpt, tmp_path / "eval")
    totals = np.array(ev["rewards"])
    ocr = totals / 1.5  # both rewards read the same image with the same recogniser
    assert ((totals >= 1 - 1e-6) & (ocr < 1 - 1e-6)).any()  # the case the weighted sum miscounted
    expected = float(np.mean(ocr >= 1 - 1e-6))
    assert ev["exact_match"] == pytest.approx(expected, abs=1e-9)
    assert val["val_exact_match"] == pytest.approx(expected, abs=1e-9)


def test_exact_match_is_absent_for_a_job_that_matches_no_text(tmp_path):
    """A JPEG-only job reads no text: no exact match in rewards.json, the eval line or the run's table."""
    from omnirl.launch.progress import validation_table
    from omnirl.scorers.text import exact_match

    assert exact_match([{"ocr": 1.0, "jpeg": -2.0}, {"ocr": 0.99}, {}], ["ocr"]) == pytest.approx(1 / 3)
    assert exact_match([{"jpeg": 5.0}], []) is None
    job = _job(tmp_path, "exact-jpeg", {"family": "ocr-digits", "path": "builtin", "dtype": "float32"})
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["reward"] = [{"name": "jpeg", "kind": "jpeg"}]
    job.write_text(yaml.safe_dump(doc))
    ev = _eval(job, _checkpoint(load_adapter("ocr-digits", "builtin"), tmp_path / "ckpt"), tmp_path / "eval")
    assert ev["exact_match"] is None
    table = validation_table([{"event": "validation", "step": 0, "policy_version": 0, "val_reward_mean": -2.0,
                               "val_exact_match": None, "val_background_darkness": 0.5, "grid": "g.png"}])
    assert "│ —" in table and "-2.000" in table


def test_eval_refuses_an_out_holding_an_evaluation_unless_overwrite(tmp_path, capsys):
    """A second `omnirl eval --out DIR` replaced the first one's rewards.json and grid.png without a word:
    it is refused (exit 2, one line naming the file and both fixes) with the first one's files untouched;
    `--overwrite` replaces them."""
    job = _job(tmp_path, "eval-twice", {"family": "ocr-digits", "path": "builtin", "dtype": "float32"})
    prompts = tmp_path / "p.txt"
    prompts.write_text('"12"\n"345"\n')
    out = tmp_path / "eval"
    argv = ["eval", str(job), "--prompts", str(prompts), "--out", str(out)]
    assert cli_main([*argv, "--sampling-steps", "2"]) == 0
    first = {name: (out / name).read_bytes() for name in ("rewards.json", "grid.png")}
    capsys.readouterr()
    assert cli_main([*argv, "--sampling-steps", "3"]) == 2
    assert capsys.readouterr().err == (f"omnirl eval: --out {out}: already holds an evaluation ({out / 'rewards.json'}); "
                                       "pass another --out to keep it, or --overwrite to replace it\n")
    assert {name: (out / name).read_bytes() for name in first} == first
    (out / "rewards.json").unlink()  # a grid alone is an evaluation's output too
    assert cli_main([*argv, "--sampling-steps", "3"]) == 2
    assert f"({out / 'grid.png'})" in capsys.readouterr().err
    assert (out / "grid.png").read_bytes() == first["grid.png"]
    assert cli_main([*argv, "--sampling-steps", "3", "--overwrite"]) == 0
    assert json.loads((out / "rewards.json").read_text())["denoising_steps"] == 3
    assert (out / "grid.png").read_bytes() != first["grid.png"]  # 3 denoising steps draw other images than 2
