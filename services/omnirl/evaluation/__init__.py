"""Offline evaluation (`omnirl eval`): a checkpoint's held-out reward, as in-run validation measures it.

It builds validation's requests (`omnirl.api.heldout.heldout_request`), runs them through an
in-process `RolloutEngine` (the only denoising loop) and scores them with the job's weighted
rewards (`omnirl.reward.scoring.RewardSet`, as the reward role does).
"""
