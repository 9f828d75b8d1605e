"""RLJob status models and metav1 condition semantics."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from omnirl.api.status import (
    PHASES,
    Condition,
    RLJobStatus,
    RoleStatus,
    get_condition,
    ready_roles_text,
    set_condition,
    utc_now,
)

T0 = datetime(2026, 5, 9, 7, 0, 0, tzinfo=timezone.utc)
T1 = T0 + timedelta(minutes=5)
T2 = T0 + timedelta(minutes=9)


def _c(type_: str, status: str, reason: str = "Because", message: str = "", gen: int | None = 1) -> Condition:
    return Condition(type=type_, status=status, reason=reason, message=message, observedGeneration=gen)


def test_new_condition_gets_now_and_input_is_not_modified() -> None:
    before: list[Condition] = []
    after = set_condition(before, _c("Ready", "False", "RolesStarting"), T0)
    assert before == []
    assert [(c.type, c.status, c.lastTransitionTime) for c in after] == [("Ready", "False", T0)]


def test_same_status_keeps_transition_time_but_updates_reason_message_generation() -> None:
    conds = set_condition([], _c("Ready", "False", "RolesStarting"), T0)
    conds = set_condition(conds, _c("Ready", "False", "ImagePulling", "pulling rollout image", gen=2), T1)
    (c,) = conds
    assert (c.reason, c.message, c.observedGeneration, c.lastTransitionTime) == (
        "ImagePulling",
        "pulling rollout image",
        2,
        T0,
    )


def test_status_flip_moves_transition_time_and_keeps_order() -> None:
    conds = set_condition([], _c("Ready", "False"), T0)
    conds = set_condition(conds, _c("Progressing", "True"), T0)
    conds = set_condition(conds, _c("Ready", "True", "AllRolesReady"), T1)
    conds = set_condition(conds, _c("Progressing", "True", "Training"), T2)
    assert [(c.type, c.status, c.lastTransitionTime) for c in conds] == [
        ("Ready", "True", T1),
        ("Progressing", "True", T0),
    ]
    assert get_condition(conds, "Ready").reason == "AllRolesReady"
    assert get_condition(conds, "Failed") is None


def test_now_is_truncated_to_seconds_in_utc_and_must_be_aware() -> None:
    cest = timezone(timedelta(hours=2))
    conds = set_condition([], _c("Ready", "True"), datetime(2026, 5, 9, 9, 0, 0, 123456, tzinfo=cest))
    assert conds[0].lastTransitionTime == T0
    assert conds[0].model_dump(mode="json")["lastTransitionTime"] == "2026-05-09T07:00:00Z"
    with pytest.raises(ValueError, match="timezone-aware"):
        set_condition([], _c("Ready", "True"), datetime(2026, 5, 9))
    assert utc_now().tzinfo is not None and utc_now().microsecond == 0


def test_condition_field_rules() -> None:
    with pytest.raises(ValidationError, match="reason"):
        _c("Ready", "True", reason="not camel case")
    with pytest.raises(ValidationError, match="status"):
        _c("Ready", "Yes")
    with pytest.raises(ValidationError, match="type"):
        _c("", "True")
    assert _c("omnirl.dev/WeightsSynced", "True").type == "omnirl.dev/WeightsSynced"


def test_ready_roles_text() -> None:
    roles = {
        "rollout": RoleStatus(desired=4, ready=4),
        "reward": RoleStatus(desired=2, ready=1),
        "actor": RoleStatus(desired=1, ready=1),
        "controller": RoleStatus(desired=0, ready=0),
    }
    assert ready_roles_text(roles) == "2/4"
    assert ready_roles_text({}) == "0/0"


def test_status_round_trip_and_phases() -> None:
    st = RLJobStatus(
        phase="Running",
        conditions=set_condition([], _c("Ready", "True"), T0),
        observedGeneration=3,
        roles={"rollout": RoleStatus(desired=1, ready=1)},
        readyRoles="1/1",
        step=12,
        rewardMean=0.625,
        policyVersion=12,
        lastCheckpoint="/runs/x/checkpoints/step-10",
        startTime=T0,
        restarts=1,
    )
    d = st.model_dump(mode="json")
    assert d["startTime"] == "2026-05-09T07:00:00Z" and d["completionTime"] is None
    assert RLJobStatus.model_validate(d) == st
    assert PHASES == ("Pending", "Running", "Suspended", "Succeeded", "Failed")
    with pytest.raises(ValidationError, match="phase\n  Input should be 'Pending', 'Running'"):
        RLJobStatus(phase="Done")
    with pytest.raises(ValidationError, match=r"readyRoles\n  String should match pattern"):
        RLJobStatus(readyRoles="four")
