"""omnirl.algorithms.sigmas and .sde: hand-computed values, properties, and a statistical check."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omnirl.algorithms import gaussian_log_prob, ode_step, sde_mean_std, sde_step, sigma_schedule

FLOATS = st.floats(-4.0, 4.0, allow_nan=False, width=32)


def test_sigma_schedule_hand_values():
    assert sigma_schedule(4).tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]
    # shift 3: σ' = 3σ / (1 + 2σ): 0.75 → 2.25/2.5 = 0.9, 0.5 → 1.5/2 = 0.75, 0.25 → 0.75/1.5 = 0.5
    torch.testing.assert_close(sigma_schedule(4, shift=3.0), torch.tensor([1.0, 0.9, 0.75, 0.5, 0.0]))
    grid = sigma_schedule(40, shift=3.0)
    assert grid.dtype == torch.float32 and grid.shape == (41,)
    assert grid[0] == 1.0 and grid[-1] == 0.0 and bool((grid[1:] < grid[:-1]).all())


@pytest.mark.parametrize("num_steps, shift, message", [(0, 1.0, "num_steps must be an int >= 1, got 0"),
                                                       (4, 0.0, "shift must be a finite number > 0, got 0.0"),
                                                       (4, -1.0, "shift must be a finite number > 0, got -1.0"),
                                                       (4, math.inf, "shift must be a finite number > 0, got inf")])
def test_sigma_schedule_rejects_bad_input(num_steps, shift, message):
    with pytest.raises(ValueError, match=message):
        sigma_schedule(num_steps, shift)


def test_sde_mean_std_hand_computed():
    # Sample 0: x=1, v=2, σ=0.5 → 0.25, a=0.5: s = 0.5·sqrt(0.5/0.5) = 0.5, dt = -0.25,
    #   mean = 1·(1 + 0.25·(-0.25)/1) + 2·(1 + 0.25·0.5/1)·(-0.25) = 0.9375 - 0.5625 = 0.375,
    #   std = 0.5·sqrt(0.25) = 0.25.
    # Sample 1: x=-1, v=2, σ=1 → 0.75: the ratio's denominator uses σ_next: s = 0.5·sqrt(1/0.25) = 1,
    #   s²/(2σ) = 0.5, mean = -1·(1 - 0.125) + 2·(1 + 0)·(-0.25) = -1.375, std = 1·sqrt(0.25) = 0.5.
    x = torch.tensor([[1.0], [-1.0]])
    v = torch.tensor([[2.0], [2.0]])
    mean, std = sde_mean_std(x, v, torch.tensor([0.5, 1.0]), torch.tensor([0.25, 0.75]), 0.5, "sde")
    torch.testing.assert_close(mean, torch.tensor([[0.375], [-1.375]]))
    torch.testing.assert_close(std, torch.tensor([0.25, 0.5]))


def test_cps_mean_std_hand_computed():
    # x=2, v=2, σ=0.5 → 0.25, a=0.5: std = 0.25·sin(π/4) = 0.1767767; x̂0 = 2 - 1 = 1; x̂1 = 2 + 1 = 3;
    # mean = 1·0.75 + 3·sqrt(0.0625 - 0.03125) = 0.75 + 3·0.1767767 = 1.2803301.
    mean, std = sde_mean_std(torch.tensor([[2.0]]), torch.tensor([[2.0]]), torch.tensor([0.5]),
                             torch.tensor([0.25]), 0.5, "cps")
    torch.testing.assert_close(mean, torch.tensor([[1.2803301]]))
    torch.testing.assert_close(std, torch.tensor([0.1767767]))


def test_gaussian_log_prob_matches_torch_normal_averaged():
    gen = torch.Generator().manual_seed(0)
    x_next = torch.randn(3, 4, 5, generator=gen)
    mean = torch.randn(3, 4, 5, generator=gen)
    std = torch.tensor([0.3, 1.0, 2.5])
    expected = torch.distributions.Normal(mean, std[:, None, None]).log_prob(x_next).mean(dim=(1, 2))
    torch.testing.assert_close(gaussian_log_prob(x_next, mean, std), expected)
    with pytest.raises(ValueError, match=r"indices \[1\]"):
        gaussian_log_prob(x_next, mean, torch.tensor([0.3, 0.0, 1.0]))


def test_sde_step_with_given_noise_and_bf16_inputs():
    x = torch.tensor([[1.0, -1.0]], dtype=torch.bfloat16)
    v = torch.tensor([[2.0, 2.0]], dtype=torch.bfloat16)
    noise = torch.tensor([[1.0, -2.0]])
    out = sde_step(x, v, torch.tensor([0.5]), torch.tensor([0.25]), 0.5, noise=noise)
    assert all(t.dtype == torch.float32 for t in out)
    # mean per element as in the hand test: 0.375 and -1·0.9375 - 0.5625 = -1.5; std 0.25.
    torch.testing.assert_close(out.mean, torch.tensor([[0.375, -1.5]]))
    torch.testing.assert_close(out.x_next, torch.tensor([[0.625, -2.0]]))
    # log N averaged: -mean(noise²)/2 - log 0.25 - ½log 2π = -1.25 + 1.3862944 - 0.9189385
    torch.testing.assert_close(out.log_prob, torch.tensor([-1.25 + math.log(4.0) - 0.5 * math.log(2 * math.pi)]))


def test_sde_step_is_reproducible_and_std_zero_gives_zero_log_prob():
    x, v = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    sigma, sigma_next = torch.tensor([0.5, 0.25]), torch.tensor([0.25, 0.0])
    a = sde_step(x, v, sigma, sigma_next, 0.8, "cps", generator=torch.Generator().manual_seed(7))
    b = sde_step(x, v, sigma, sigma_next, 0.8, "cps", generator=torch.Generator().manual_seed(7))
    assert torch.equal(a.x_next, b.x_next) and torch.equal(a.log_prob, b.log_prob)
    # CPS at σ_next = 0 (sample 1) is deterministic: std 0, x_next = mean, log_prob defined as 0.
    assert a.std[1] == 0.0 and a.std[0] > 0.0
    assert torch.equal(a.x_next[1], a.mean[1]) and a.log_prob[1] == 0.0 and a.log_prob[0] != 0.0


@pytest.mark.parametrize("sigma, sigma_next", [(0.5, 0.5), (0.5, 0.6), (1.2, 0.5), (0.5, -0.1)])
def test_sde_rejects_bad_sigmas(sigma, sigma_next):
    with pytest.raises(ValueError, match="sigma_next < sigma"):
        sde_mean_std(torch.ones(1, 2), torch.ones(1, 2), torch.tensor([sigma]), torch.tensor([sigma_next]), 0.7)


def test_sde_rejects_bad_type_and_noise_level():
    args = (torch.ones(1, 2), torch.ones(1, 2), torch.tensor([0.5]), torch.tensor([0.25]))
    with pytest.raises(ValueError, match="sde_type"):
        sde_mean_std(*args, 0.7, "ddim")
    with pytest.raises(ValueError, match="noise_level"):
        sde_mean_std(*args, -0.1)
    with pytest.raises(ValueError, match="noise_level"):
        sde_mean_std(*args, 1.2, "cps")


@settings(max_examples=40, deadline=None)
@given(values=st.lists(FLOATS, min_size=8, max_size=8), sigma=st.floats(0.01, 1.0), frac=st.floats(0.0, 0.99),
       sde_type=st.sampled_from(["sde", "cps"]))
def test_noise_level_zero_is_exactly_the_ode_step(values, sigma, frac, sde_type):
    x = torch.tensor(values[:4]).reshape(2, 2)
    v = torch.tensor(values[4:]).reshape(2, 2)
    sig = torch.full((2,), sigma)
    sig_next = sig * frac
    out = sde_step(x, v, sig, sig_next, 0.0, sde_type, generator=torch.Generator().manual_seed(0))
    expected = ode_step(x, v, sig, sig_next)
    assert torch.equal(out.x_next, expected) and torch.equal(out.mean, expected)
    assert torch.equal(out.std, torch.zeros(2)) and torch.equal(out.log_prob, torch.zeros(2))


@settings(max_examples=40, deadline=None)
@given(mean=st.lists(FLOATS, min_size=6, max_size=6), delta=st.lists(FLOATS, min_size=6, max_size=6),
       std=st.floats(0.01, 5.0))
def test_log_prob_is_maximal_at_the_mean(mean, delta, std):
    mu = torch.tensor(mean).reshape(2, 3)
    s = torch.full((2,), std)
    at_mean = gaussian_log_prob(mu, mu, s)
    elsewhere = gaussian_log_prob(mu + torch.tensor(delta).reshape(2, 3), mu, s)
    assert bool((at_mean >= elsewhere).all())
    torch.testing.assert_close(at_mean, -torch.log(s) - 0.5 * math.log(2 * math.pi))


# --- statistical: the SDE keeps the marginals of a 1-D Gaussian flow ---------------------------
# Data x0 ~ N(m, s0²), ε ~ N(0, 1), x_σ = (1-σ)x0 + σε ~ N((1-σ)m, V_σ), V_σ = (1-σ)²s0² + σ².
# v = ε - x0 is jointly Gaussian with x_σ: E[v] = -m, Cov(v, x_σ) = σ - (1-σ)s0², so the exact
# marginal velocity is linear: v(x, σ) = -m + (σ - (1-σ)s0²)/V_σ · (x - (1-σ)m).
M, S0 = 1.5, 0.5


def _velocity(x: torch.Tensor, sigma: float) -> torch.Tensor:
    var = (1 - sigma) ** 2 * S0**2 + sigma**2
    return -M + (sigma - (1 - sigma) * S0**2) / var * (x - (1 - sigma) * M)


def _discrete_moments(grid: list[float], a: float) -> dict[int, tuple[float, float]]:
    """Exact mean/std after each step of the Euler–Maruyama SDE (linear map + Gaussian noise), float64."""
    mu, var, out = 0.0, 1.0, {}
    for i, (s, sn) in enumerate(zip(grid[:-1], grid[1:], strict=True)):
        c = (s - (1 - s) * S0**2) / ((1 - s) ** 2 * S0**2 + s**2)  # v = c·x + (-M - c(1-s)M)
        s_den = sn if s == 1.0 else s
        k, dt = a * a / (2 * (1 - s_den)), sn - s  # k = s²/(2σ)
        gain = (1 + k * dt) + c * (1 + k * (1 - s)) * dt
        shift = (-M - c * (1 - s) * M) * (1 + k * (1 - s)) * dt
        mu, var = gain * mu + shift, gain**2 * var + (a * a * s / (1 - s_den)) * (-dt)
        out[i + 1] = (mu, math.sqrt(var))
    return out


def test_sde_sampling_preserves_gaussian_flow_marginals():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    n, steps, a = 20_000, 20, 0.7
    grid = sigma_schedule(steps)
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 1, generator=gen)
    seen = {}
    for i in range(steps):
        s, sn = grid[i].expand(n), grid[i + 1].expand(n)
        x = sde_step(x, _velocity(x, float(grid[i])), s, sn, a, generator=gen).x_next
        seen[i + 1] = (float(x.mean()), float(x.std()))
    discrete = _discrete_moments(grid.tolist(), a)
    for i in (10, 20):  # σ = 0.5 and σ = 0
        sigma = float(grid[i])
        true_mean, true_std = (1 - sigma) * M, math.sqrt((1 - sigma) ** 2 * S0**2 + sigma**2)
        mean, std = seen[i]
        se_mean, se_std = true_std / math.sqrt(n), true_std / math.sqrt(2 * n)
        # The mean of this linear flow is transported exactly: within 4 standard errors.
        assert abs(mean - true_mean) < 4 * se_mean, (i, mean, true_mean)
        # The sampled spread equals the scheme's exact discrete std (4 standard errors) ...
        assert abs(std - discrete[i][1]) < 4 * se_std, (i, std, discrete[i][1])
        # ... which is the flow's std up to the Euler–Maruyama bias (see the next test):
        # +4.8 % at σ = 0.5 and -1.7 % at σ = 0 with 20 steps; a wrong drift or noise scale is off by 25–75 %.
        assert abs(std / true_std - 1) < 0.06, (i, std, true_std)


def test_sde_discretisation_bias_shrinks_with_more_steps():
    """The first step from σ = 1 has k·dt = -a²/2 for any grid, so the bias decays slowly (≈ N^-0.6)."""
    true_mid = math.sqrt(0.25 * S0**2 + 0.25)
    bias = {n: _discrete_moments(sigma_schedule(n).tolist(), 0.7)[n // 2][1] / true_mid - 1 for n in (20, 80, 320)}
    assert 0.04 < bias[20] < 0.06 and 0.015 < bias[80] < 0.025 and 0.0 < bias[320] < 0.01
    # The test's own recursion agrees with sde_mean_std applied to two points (it is the same linear map).
    mean, std = sde_mean_std(torch.tensor([[0.0], [1.0]]), _velocity(torch.tensor([[0.0], [1.0]]), 0.5),
                             torch.tensor([0.5, 0.5]), torch.tensor([0.45, 0.45]), 0.7)
    torch.testing.assert_close(std, torch.full((2,), 0.7 * math.sqrt(0.05)))


def test_cps_is_exact_for_a_point_mass_data_distribution():
    """With x0 ≡ m the velocity is exact, x̂0 = m, x̂1 = ε, and CPS keeps x_σ = (1-σ)m + σ·N(0,1) exactly."""
    n, m = 20_000, 1.5
    grid = sigma_schedule(10)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(n, 1, generator=gen)
    for i in range(5):  # to σ = 0.5
        sigma = float(grid[i])
        v = (x - (1 - sigma) * m) / sigma - m  # ε - x0 with ε = (x - (1-σ)m)/σ
        x = sde_step(x, v, grid[i].expand(n), grid[i + 1].expand(n), 0.8, "cps", generator=gen).x_next
    z = (x - 0.5 * m) / 0.5
    assert abs(float(z.mean())) < 4 / math.sqrt(n) and abs(float(z.std()) - 1) < 4 / math.sqrt(2 * n)


def test_the_step_checks_on_an_accelerator_are_queued_and_never_read_the_device():
    """On a non-CPU device the σ check is queued (`torch._assert_async`): nothing reads values back.

    The meta device has no values at all, so any read (the failing indices, `.tolist()`) raises
    here; on a GPU such a read was a host sync per check, several per denoising step."""
    x = torch.empty(4, 16, 8, 8, device="meta")
    sigma, sigma_next = torch.empty(4, device="meta"), torch.empty(4, device="meta")
    assert ode_step(x, x, sigma, sigma_next).shape == (4, 16, 8, 8)
    out = sde_step(x, x, sigma, sigma_next, 0.8, "cps", noise=torch.empty(4, 16, 8, 8, device="meta"))
    assert out.log_prob.shape == (4,) and out.log_prob.device.type == "meta"


def test_require_names_the_check_and_reads_details_only_on_the_cpu():
    from omnirl.algorithms._tensors import require

    def detail():
        raise AssertionError("detail read on an accelerator")

    require(torch.zeros(3, dtype=torch.bool, device="meta"), "x must be positive", detail)  # queued, not read
    with pytest.raises(ValueError, match=r"^x must be positive; at indices \[1\]$"):
        require(torch.tensor([True, False]), "x must be positive", lambda: "at indices [1]")
