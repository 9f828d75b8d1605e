"""The multi-modal sample path (docs/omni.md): the flat latent's layout, the joint SDE log-prob with a trained
mask, per-modality loss weights, per-modality CFG, and a video+audio sample through the TransferQueue.

Closed forms: the joint log-prob over the concatenation is (Σ_m D_m · logp_m) / Σ_m D_m; a modality left out
of the policy takes the ODE update and is in no log-prob; the weighted losses are Σ_m w_m · (the one-modality
loss of modality m).
"""

from __future__ import annotations

import math

import pytest
import redis
import torch

from omnirl.algorithms import (
    Modalities,
    gaussian_kl,
    gaussian_log_prob,
    matching_error,
    nft_loss,
    ode_step,
    sde_mean_std,
    sde_step,
    trained_mean,
    weighted_mean,
)
from omnirl.models.layout import LatentLayout, ModalitySlot, guided
from omnirl.transfer import TransferQueue
from omnirl.transfer.media import check_media, poster

VIDEO, AUDIO = (2, 3, 4, 5), (4, 6)  # D_video = 120, D_audio = 24
D_V, D_A = math.prod(VIDEO), math.prod(AUDIO)


def _layout(audio_trained: bool = True, weights: tuple[float, float] = (1.0, 1.0),
            guidance: tuple[float, float] = (1.0, 1.0)) -> LatentLayout:
    return LatentLayout([ModalitySlot("video", VIDEO, True, weights[0], guidance[0]),
                         ModalitySlot("audio", AUDIO, audio_trained, weights[1], guidance[1])])


def test_layout_splits_video_first_then_audio_and_joins_back() -> None:
    layout = _layout()
    assert layout.numel == D_V + D_A
    assert layout.segments == [("video", 0, D_V), ("audio", D_V, D_V + D_A)]
    x = torch.arange(2 * layout.numel, dtype=torch.float32).reshape(2, -1)
    parts = layout.split(x)
    assert parts["video"].shape == (2, *VIDEO) and parts["audio"].shape == (2, *AUDIO)
    assert float(parts["audio"][0].flatten()[0]) == D_V  # the split index is video's size
    assert torch.equal(layout.join(parts), x)
    with pytest.raises(ValueError, match="order"):
        LatentLayout([ModalitySlot("audio", AUDIO), ModalitySlot("video", VIDEO)])
    with pytest.raises(ValueError, match="at least one modality must be trained"):
        LatentLayout([ModalitySlot("video", VIDEO, trained=False)])


def test_modalities_normalise_the_weights_and_drop_an_untrained_modality() -> None:
    mods = _layout(weights=(3.0, 1.0)).modalities()
    assert mods.bounds == ((0, D_V), (D_V, D_V + D_A)) and mods.weights == (0.75, 0.25)
    left_out = _layout(audio_trained=False, weights=(3.0, 1.0)).modalities()
    assert left_out.weights == (1.0, 0.0)
    assert left_out.trained_mask().sum() == D_V and not bool(left_out.trained_mask()[D_V:].any())


def _step(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, D_V + D_A, generator=g)
    v = torch.randn(3, D_V + D_A, generator=g)
    noise = torch.randn(3, D_V + D_A, generator=g)
    sigma, sigma_next = torch.tensor([0.9, 0.7, 0.5]), torch.tensor([0.8, 0.6, 0.4])
    return x, v, noise, sigma, sigma_next


@pytest.mark.parametrize("sde_type", ["sde", "cps"])
def test_joint_log_prob_is_the_size_weighted_mean_of_the_per_modality_log_probs(sde_type: str) -> None:
    x, v, noise, sigma, sigma_next = _step()
    out = sde_step(x, v, sigma, sigma_next, 0.7, sde_type=sde_type, noise=noise)
    mean, std = sde_mean_std(x, v, sigma, sigma_next, 0.7, sde_type)
    logp_v = gaussian_log_prob(out.x_next[:, :D_V], mean[:, :D_V], std)
    logp_a = gaussian_log_prob(out.x_next[:, D_V:], mean[:, D_V:], std)
    expected = (D_V * logp_v + D_A * logp_a) / (D_V + D_A)
    torch.testing.assert_close(out.log_prob, expected, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(logp_v, logp_a)  # the weighting is exercised, not a tie


def test_a_modality_left_out_takes_the_ode_update_and_is_excluded_from_the_log_prob() -> None:
    x, v, noise, sigma, sigma_next = _step(1)
    mask = _layout(audio_trained=False).trained_mask()
    out = sde_step(x, v, sigma, sigma_next, 0.7, noise=noise, mask=mask)
    full = sde_step(x, v, sigma, sigma_next, 0.7, noise=noise)
    assert torch.equal(out.x_next[:, :D_V], full.x_next[:, :D_V])  # video: the SDE sample
    assert torch.equal(out.x_next[:, D_V:], ode_step(x, v, sigma, sigma_next)[:, D_V:])  # audio: the ODE
    mean, std = sde_mean_std(x, v, sigma, sigma_next, 0.7)
    torch.testing.assert_close(out.log_prob, gaussian_log_prob(out.x_next[:, :D_V], mean[:, :D_V], std),
                               rtol=1e-6, atol=1e-6)
    # the audio's values do not move the log-prob at all
    moved = out.x_next.clone()
    moved[:, D_V:] += 5.0
    assert torch.equal(gaussian_log_prob(moved, mean, std, mask), out.log_prob)
    kl = gaussian_kl(mean + 0.1, mean, std, mask)
    torch.testing.assert_close(kl, 0.01 / (2 * std**2))


def test_trained_mean_without_a_mask_is_todays_element_mean_bit_for_bit() -> None:
    t = torch.randn(4, 3, 8, 8)
    assert torch.equal(trained_mean(t, None), t.reshape(4, -1).mean(dim=1))
    assert torch.equal(weighted_mean(t, None), t.reshape(4, -1).mean(dim=1))


def test_nft_and_matching_losses_are_the_weighted_sums_of_the_one_modality_losses() -> None:
    g = torch.Generator().manual_seed(2)
    b, d = 4, D_V + D_A
    x0, eps, v_theta, v_old = (torch.randn(b, d, generator=g) for _ in range(4))
    sigma, r = torch.rand(b, generator=g), torch.rand(b, generator=g)
    x_t = (1 - sigma[:, None]) * x0 + sigma[:, None] * eps
    mods = _layout(weights=(3.0, 1.0)).modalities()
    joint = nft_loss(x0, x_t, sigma, v_theta, v_old, r, 1.0, mods).loss
    parts = [nft_loss(x0[:, lo:hi], x_t[:, lo:hi], sigma, v_theta[:, lo:hi], v_old[:, lo:hi], r, 1.0).loss
             for lo, hi in mods.bounds]
    torch.testing.assert_close(joint, 0.75 * parts[0] + 0.25 * parts[1])
    err = matching_error(v_theta, x0, eps, mods)
    torch.testing.assert_close(err, 0.75 * matching_error(v_theta[:, :D_V], x0[:, :D_V], eps[:, :D_V])
                               + 0.25 * matching_error(v_theta[:, D_V:], x0[:, D_V:], eps[:, D_V:]))


def test_an_untrained_modality_gets_no_gradient_from_the_losses() -> None:
    g = torch.Generator().manual_seed(3)
    x0, eps = torch.randn(2, D_V + D_A, generator=g), torch.randn(2, D_V + D_A, generator=g)
    v = torch.randn(2, D_V + D_A, generator=g, requires_grad=True)
    mods = _layout(audio_trained=False).modalities()
    matching_error(v, x0, eps, mods).sum().backward()
    assert v.grad[:, :D_V].abs().sum() > 0 and torch.equal(v.grad[:, D_V:], torch.zeros(2, D_A))
    v.grad = None
    x_t = 0.5 * x0 + 0.5 * eps
    nft_loss(x0, x_t, torch.full((2,), 0.5), v, v.detach() + 0.1, torch.tensor([0.2, 0.9]), 1.0, mods).loss.backward()
    assert v.grad[:, :D_V].abs().sum() > 0 and torch.equal(v.grad[:, D_V:], torch.zeros(2, D_A))


def test_guidance_applies_to_each_modality_with_its_own_scale() -> None:
    g = torch.Generator().manual_seed(4)
    cond, uncond = torch.randn(2, D_V + D_A, generator=g), torch.randn(2, D_V + D_A, generator=g)
    layout = _layout(guidance=(3.0, 2.0))
    out = guided(cond, uncond, layout)
    torch.testing.assert_close(out[:, :D_V], uncond[:, :D_V] + 3.0 * (cond[:, :D_V] - uncond[:, :D_V]))
    torch.testing.assert_close(out[:, D_V:], uncond[:, D_V:] + 2.0 * (cond[:, D_V:] - uncond[:, D_V:]))
    assert torch.equal(guided(cond, uncond, _layout())[:, D_V:], cond[:, D_V:])  # scale 1: the conditional one


def _media(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"video": torch.randint(0, 256, (8, 32, 64, 3), generator=g, dtype=torch.uint8),
            "audio": torch.rand(8000, generator=g) * 2 - 1,
            "audio_sample_rate": torch.tensor(8000, dtype=torch.int64), "fps": torch.tensor(8.0)}


def test_a_video_audio_sample_round_trips_the_queue_bit_exactly(redis_client: redis.Redis) -> None:
    q = TransferQueue(redis_client, "omni-core")
    media = _media(5)
    tensors = {"x0": torch.randn(D_V + D_A), "latents": torch.zeros(0, D_V + D_A)}
    q.publish(q.streams.samples, {"sample_id": "0:0:0"}, tensors, media=media)
    [msg] = q.consume(q.streams.samples, "reward", "w0", block_ms=0)
    back = q.load_media(msg)
    assert sorted(back) == sorted(media)
    for key, value in media.items():
        assert back[key].dtype == value.dtype and torch.equal(back[key], value), key
    assert torch.equal(q.load_image(msg), poster(media))  # the sample as one picture: its frames side by side
    assert q.load_image(msg).shape == (32, 8 * 64, 3)
    assert "video" not in q.load_tensors(msg)  # the trajectory key holds no media
    with pytest.raises(ValueError, match="audio without audio_sample_rate"):
        q.publish(q.streams.samples, {"sample_id": "0:0:1"}, tensors,
                  media={"audio": media["audio"], "fps": media["fps"]})
    with pytest.raises(ValueError, match="not both"):
        q.publish(q.streams.samples, {"sample_id": "0:0:2"}, tensors, image=media["video"][0], media=media)
    q.cleanup()


def test_media_are_checked_against_the_contract() -> None:
    assert check_media(_media(6))
    with pytest.raises(ValueError, match=r"\['video'\]: expected torch.uint8"):
        check_media({**_media(6), "video": torch.zeros(8, 32, 64, 3)})
    with pytest.raises(ValueError, match="unknown keys"):
        check_media({**_media(6), "spectrogram": torch.zeros(3)})


def test_modalities_refuse_bounds_that_do_not_tile_the_latent() -> None:
    from omnirl.algorithms.modalities import check_modalities

    with pytest.raises(ValueError, match="tile"):
        check_modalities(Modalities(((0, 5), (6, 9)), (0.5, 0.5)))
    with pytest.raises(ValueError, match="sum to 1"):
        check_modalities(Modalities(((0, 5), (5, 9)), (1.0, 1.0)))
