"""The metric names omnirl exports (docs/architecture.md §6; docs/reference/metrics.md is generated from here). Dashboards may use only these (a test checks).

Prometheus names: OpenTelemetry instrument `omnirl_x` with unit `s` becomes `omnirl_x_seconds`…
to keep one spelling, every instrument here is created without a unit and already carries its unit
in its name; histograms add `_bucket`, `_sum`, `_count`.
"""

from __future__ import annotations

# controller: one value per training step
STEP_SECONDS = "omnirl_step_seconds"  # histogram, label phase=total|rollout|reward|train|sync
IMAGES_PER_SECOND = "omnirl_images_per_second"  # gauge
REWARD_MEAN = "omnirl_reward_mean"  # gauge, label reward=<name>|total (raw weighted sum when normalised)
REWARD_STD = "omnirl_reward_std"  # gauge (raw weighted sum's spread when normalised)
REWARD_COMPONENT_STD = "omnirl_reward_component_std"  # gauge, label reward=<name> (raw score spread)
REWARD_COMPONENT_MISSING = "omnirl_reward_component_missing"  # gauge, label reward=<name> (samples without it)
REWARD_REPLICAS = "omnirl_reward_replicas"  # gauge (reward workers the operator's autoscaler asks for)
VALIDATION_REWARD = "omnirl_validation_reward_mean"  # gauge
TRAINING_STEP = "omnirl_training_step"  # gauge
POLICY_VERSION = "omnirl_policy_version"  # gauge
POLICY_STALENESS = "omnirl_policy_staleness"  # gauge (mean versions behind)
KL = "omnirl_kl"  # gauge
CLIP_FRACTION = "omnirl_clip_fraction"  # gauge
IS_WEIGHT = "omnirl_is_weight_mean"  # gauge
IS_ESS = "omnirl_is_effective_sample_size"  # gauge
RS_MASKED_FRACTION = "omnirl_rs_masked_fraction"  # gauge
LOGPROB_MISMATCH = "omnirl_logprob_mismatch"  # gauge, label step=<denoising step>: mean |Δ log_prob| rollout vs actor
LOGPROB_MISMATCH_MAX = "omnirl_logprob_mismatch_max"  # gauge: max |Δ log_prob| over (sample, step)
GRAD_NORM = "omnirl_grad_norm"  # gauge
LOSS = "omnirl_loss"  # gauge
WEIGHT_SYNC_SECONDS = "omnirl_weight_sync_seconds"  # histogram
REWARD_LATENCY_SECONDS = "omnirl_reward_latency_seconds"  # histogram (generated → scored), one per sample
QUEUE_DEPTH = "omnirl_queue_depth"  # gauge, label stream
QUEUE_LAG = "omnirl_queue_lag"  # gauge, label stream (entries not yet delivered)
GROUPS_DROPPED = "omnirl_groups_dropped_total"  # counter
GROUPS_REFILLED = "omnirl_groups_refilled_total"  # counter
ZERO_STD_GROUPS = "omnirl_zero_std_groups_total"  # counter
SAMPLES_TRAINED = "omnirl_samples_trained_total"  # counter

# Bucket upper bounds (seconds) of the three histograms: from a LoRA weight sync (0.2 s on a GPU) to a
# CPU step of minutes. OpenTelemetry's default (0, 5, 10, 25, … 10000) is made for milliseconds: every
# reward latency (~1 s) and weight sync fell in (0, 5], so the dashboards' histogram_quantile read
# 2.5 s (p50) and 4.75 s (p95) whatever the job did.
SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0,
                   2500.0)

# The `# HELP` line of each (Prometheus and Grafana show it; it was empty).
HELP = {
    STEP_SECONDS: "Seconds of one training step, by phase (total, rollout, reward, train, sync)",
    IMAGES_PER_SECOND: "Training samples per second of the last step (samples / step seconds)",
    REWARD_MEAN: ("Mean reward of the last step's trained samples: the weighted total (of the raw components in a job "
                  "that normalises a reward), or one raw component"),
    REWARD_STD: ("Standard deviation of the last step's total reward over its trained samples (of the raw weighted "
                 "sums in a job that normalises a reward)"),
    REWARD_COMPONENT_STD: "Standard deviation of one reward component's raw scores in the last step",
    REWARD_COMPONENT_MISSING: "Samples of the last step a non-required reward component failed on",
    REWARD_REPLICAS: "Reward workers the operator's autoscaler asks for",
    VALIDATION_REWARD: "Mean held-out reward of the last validation (ODE sampler)",
    TRAINING_STEP: "Number (from 0) of the last trained step, as in metrics.jsonl",
    POLICY_VERSION: "Policy version after the last trained step",
    POLICY_STALENESS: "Mean policy versions the last step's samples lagged behind",
    KL: "KL to the reference policy in the last step",
    CLIP_FRACTION: "Fraction of clipped ratios in the last step (FlowGRPO)",
    IS_WEIGHT: "Mean importance weight, rollout vs actor (FlowGRPO rollout correction)",
    IS_ESS: "Normalised effective sample size of the importance weights (FlowGRPO)",
    RS_MASKED_FRACTION: "Fraction of samples masked by rejection sampling (FlowGRPO)",
    LOGPROB_MISMATCH: "Mean |rollout - actor log-prob| per denoising step (FlowGRPO)",
    LOGPROB_MISMATCH_MAX: "Largest |rollout - actor log-prob| over the last step's samples and steps (FlowGRPO)",
    GRAD_NORM: "Gradient norm of the last step",
    LOSS: "Training loss of the last step",
    WEIGHT_SYNC_SECONDS: "Seconds to broadcast the new weights to every rollout worker",
    REWARD_LATENCY_SECONDS: "Seconds from a sample's generation to its score, one observation per trained sample",
    QUEUE_DEPTH: "Entries in a TransferQueue stream (requests, samples, scores)",
    QUEUE_LAG: "Entries of a TransferQueue stream not yet delivered to its consumer group",
    GROUPS_DROPPED: "Prompt groups dropped (a member failed after every refill)",
    GROUPS_REFILLED: "Prompt groups regenerated after a member failed or was too stale",
    ZERO_STD_GROUPS: "Prompt groups whose rewards were all equal (no advantage signal)",
    SAMPLES_TRAINED: "Samples the actor trained on",
}

ALL = [
    STEP_SECONDS, IMAGES_PER_SECOND, REWARD_MEAN, REWARD_STD, REWARD_COMPONENT_STD, REWARD_COMPONENT_MISSING,
    REWARD_REPLICAS, VALIDATION_REWARD, TRAINING_STEP, POLICY_VERSION,
    POLICY_STALENESS, KL, CLIP_FRACTION, IS_WEIGHT, IS_ESS, RS_MASKED_FRACTION, LOGPROB_MISMATCH,
    LOGPROB_MISMATCH_MAX, GRAD_NORM, LOSS,
    WEIGHT_SYNC_SECONDS, REWARD_LATENCY_SECONDS, QUEUE_DEPTH, QUEUE_LAG, GROUPS_DROPPED, GROUPS_REFILLED,
    ZERO_STD_GROUPS, SAMPLES_TRAINED,
]
