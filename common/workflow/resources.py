"""What the scheduler reserves for each rule: a profile's ``resources`` entry of the rule's class
(config ``resource_classes``, inverted by :func:`common.config.resource_class_of` when the profile
loads), with the profile's per-rule ``overrides`` on top. rules/common.smk turns it into each rule's
``threads:`` and ``resources:``.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import Profile
from ..errors import UserError

@dataclass(frozen=True)
class RuleResources:
    """What the scheduler reserves for one rule (a profile's ``resources`` entry).

    ``runtime`` is in minutes; ``gpus`` become SLURM's ``--gpus``; an ``exclusive`` rule (a
    timing rule) never shares the machine: locally it takes every core Snakemake was given,
    under SLURM it asks for a node of its own."""
    threads: int
    mem_mb: int
    runtime: int
    gpus: int = 0
    exclusive: bool = False

    def snakemake(self) -> dict:
        """The rule's ``resources:`` (names the SLURM executor plugin reads; an executor that
        does not know ``cpus_per_task`` or ``slurm_extra`` ignores them)."""
        res = {"mem_mb": self.mem_mb, "runtime": self.runtime, "cpus_per_task": self.threads}
        if self.gpus:
            res["gpu"] = self.gpus
        if self.exclusive:
            res["slurm_extra"] = "--exclusive"
        return res


def rule_resources(profile: Profile, key: str) -> RuleResources:
    """Rule ``key``'s reservation: its class's entry of the profile's ``resources`` with the
    profile's ``overrides`` for the rule on top (validated by the schema); UserError when the rule
    has no class or the profile no entry for it, so a rule cannot go without."""
    table = profile.raw["resources"]
    cls = profile.resource_class.get(key)
    if cls is None:
        raise UserError(f"config resource_classes: rule {key!r} is in no class "
                        f"(classes: {', '.join(sorted(set(profile.resource_class.values())))})")
    if cls not in table:
        raise UserError(f"config profiles/{profile.name}/resources: no entry for class {cls!r} of rule {key!r} "
                        f"(threads, mem_mb, runtime); entries: {', '.join(sorted(set(table) - {'overrides'}))}")
    return RuleResources(**{**table[cls], **table.get("overrides", {}).get(key, {})})

