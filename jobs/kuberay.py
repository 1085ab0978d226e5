"""A spec's ``kuberay`` block: what ``rayjobs export kuberay`` writes into the RayJob beyond the job itself.

A Ray cluster has no use for it, so ``submit`` ignores it. The rules KubeRay's operator checks on a RayJob's
``deletionStrategy.deletionRules`` (``ray-operator/controllers/ray/utils/validation.go``) are checked here, so
that a spec that loads is one whose rules the operator accepts. Imports pydantic only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from jobs.strict import StrictModel

INT32_MAX = 2**31 - 1  # the CRD's int32 fields: ttlSeconds, and the deadlines
DeletionPolicy = Literal["DeleteWorkers", "DeleteCluster", "DeleteSelf", "DeleteNone"]
# KubeRay's order of deletion: for one condition, a later policy's after_s may not be shorter than an earlier one's.
DELETION_ORDER: tuple[DeletionPolicy, ...] = ("DeleteWorkers", "DeleteCluster", "DeleteSelf")


class DeletionRule(StrictModel):
    """One step of a RayJob's clean-up: what KubeRay deletes, once the job ended how, and how long after."""

    policy: DeletionPolicy = Field(
        description="What to delete: DeleteWorkers (the worker pods; the head stays, with its logs), DeleteCluster "
        "(the whole RayCluster), DeleteSelf (the RayJob, and its cluster with it), DeleteNone (nothing).")
    job_status: Literal["SUCCEEDED", "FAILED"] | None = Field(
        None, description="Apply the rule when the Ray job ended so. Give this or job_deployment_status.")
    job_deployment_status: Literal["Failed"] | None = Field(
        None, description="Apply the rule when the RayJob itself failed (its job could not be submitted, a deadline "
        "passed), whatever became of the Ray job. Give this or job_status.")
    after_s: int = Field(0, strict=True, ge=0, le=INT32_MAX,
                         description="Seconds after the job ends before the rule applies (KubeRay's ttlSeconds).")

    @model_validator(mode="after")
    def _one_condition(self) -> DeletionRule:
        given = [name for name in ("job_status", "job_deployment_status") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"{'gives both job_status and job_deployment_status' if given else 'has no condition'}: "
                             "give job_status (SUCCEEDED or FAILED) or job_deployment_status (Failed), one of them")
        return self

    @property
    def condition(self) -> str:
        """The condition in words, as a user wrote it: ``job_status FAILED``."""
        if self.job_status is not None:
            return f"job_status {self.job_status}"
        return f"job_deployment_status {self.job_deployment_status}"


class KubeRaySpec(StrictModel):
    """What a RayJob exported from this spec holds besides the job: used by ``rayjobs export kuberay`` only."""

    deletion_rules: list[DeletionRule] | None = Field(
        None, min_length=1, description="What KubeRay deletes when the job ends, and when (the RayJob's "
        "deletionStrategy.deletionRules), instead of the export's default: the whole cluster deleted a fixed time "
        "after any end. Needs the "
        "operator's RayJobDeletionPolicy feature gate, and cannot go with queue (Kueue wants the cluster deleted "
        "at the job's end). For one condition, DeleteWorkers comes no later than DeleteCluster, and DeleteCluster "
        "no later than DeleteSelf.",
        examples=[[{"job_status": "FAILED", "policy": "DeleteWorkers", "after_s": 300},
                   {"job_status": "FAILED", "policy": "DeleteCluster", "after_s": 3600},
                   {"job_status": "SUCCEEDED", "policy": "DeleteCluster", "after_s": 60}]])

    @field_validator("deletion_rules")
    @classmethod
    def _rules_agree(cls, rules: list[DeletionRule] | None) -> list[DeletionRule] | None:
        after_by_condition: dict[str, dict[str, tuple[int, int]]] = {}
        for number, rule in enumerate(rules or [], start=1):
            seen = after_by_condition.setdefault(rule.condition, {})
            if rule.policy in seen:
                raise ValueError(f"rules {seen[rule.policy][0]} and {number} both say {rule.policy} on "
                                 f"{rule.condition}: keep one")
            seen[rule.policy] = (number, rule.after_s)
        for condition, seen in after_by_condition.items():
            ordered = [(policy, seen[policy]) for policy in DELETION_ORDER if policy in seen]
            for (earlier, (earlier_number, earlier_s)), (later, (number, later_s)) in zip(ordered, ordered[1:]):
                if later_s < earlier_s:
                    raise ValueError(f"on {condition}, rule {number} ({later} after {later_s} s) comes before rule "
                                     f"{earlier_number} ({earlier} after {earlier_s} s): KubeRay wants DeleteWorkers "
                                     "no later than DeleteCluster, and DeleteCluster no later than DeleteSelf")
        return rules
