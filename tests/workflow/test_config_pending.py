"""``study.pending``: labels the final one-host study will measure, checked now (their decoder
must be registered and their options present), run by no rule yet."""
import copy

import pytest

from common.config import load_config, load_profile, read_config
from common.errors import UserError
from common.workflow.artifacts import study_labels

CFG = read_config()


def _with_pending(labels):
    cfg = copy.deepcopy(CFG)
    cfg["profiles"]["embedded"]["study"]["pending"] = labels
    return cfg


def test_pending_labels_are_valid_and_not_run():
    pending = CFG["profiles"]["embedded"]["study"]["pending"]
    assert {"pool@t8", "pool@t16", "recycling@t80", "suffix@rest", "samd@dyn8v8k"} <= set(pending)
    profile = load_profile(load_config(copy.deepcopy(CFG)), "embedded")
    assert all(label in profile.cross.decoder_config for label in pending)
    assert not set(pending) & set(study_labels(profile))   # no rule's list gains them


PENDING = CFG["profiles"]["embedded"]["study"]["pending"]


@pytest.mark.parametrize("labels,msg", [
    (None, "no group of any profile runs '(recycling|suffix|samd|pool|eagle3)@"),   # unused options
    ([*PENDING, "pool@t9"], "label 'pool@t9' has no decoder_config entry"),
    ([*PENDING, "nope@x"], "unknown decoder 'nope'"),
])
def test_pending_labels_are_checked(labels, msg):
    cfg = _with_pending(labels)
    if labels is None:
        del cfg["profiles"]["embedded"]["study"]["pending"]
    with pytest.raises(UserError, match=msg):
        load_config(cfg)


def test_components_named_inside_nested_options_count():
    """A pool names its EAGLE head inside ``sources``: the study's stats and the stale-settings
    check see it as they see a top-level ``"{eagle}"``."""
    from common.config import placeholders
    from common.harness.report import stale_settings
    cfg = {"total": 8, "sources": [{"name": "eagle", "head": "{eagle}"}, {"name": "suffix"}, {"name": "recycling"}]}
    assert placeholders(cfg) == ["eagle"]
    ran = {"total": 8, "sources": [{"name": "eagle", "head": ".cache/components/embedded/eagle"}, {"name": "suffix"},
                                   {"name": "recycling"}]}
    assert stale_settings([{"decoder": "pool@t8", "decoder_config": ran}], {"pool@t8": cfg}) == {}
    ran["total"] = 16
    assert "pool@t8" in stale_settings([{"decoder": "pool@t8", "decoder_config": ran}], {"pool@t8": cfg})
